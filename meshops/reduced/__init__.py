"""Reduced-order building blocks for parametric studies on one mesh.

A parametric study maps a few scalars per sample (material constants, a Reynolds
number, loads) to fields on one mesh. The classical answer is a reduced basis: the
proper orthogonal decomposition (POD) of the training snapshots in the mesh's own
quadrature inner product, and a regression from the parameters to the modal
coefficients. This package holds the mathematics of those pieces, on tensors, each in
its own module (fitting a reduced basis to a data set, the regression chosen on
validation samples, is :mod:`meshops.fitting.reduced_basis`). Imports only
:mod:`meshops.mesh`, :mod:`meshops.nn`, :mod:`meshops.search` and :mod:`meshops.utils`.
The modules:

* :mod:`~meshops.reduced.parameters`: the per-sample parameter vector of a sample
  (``params``, or the means of constant input fields);
* :mod:`~meshops.reduced.pod`: the weighted POD and its rank chosen by energy;
* :mod:`~meshops.reduced.rbf`: thin-plate-spline interpolation (scipy's
  ``RBFInterpolator`` formula, in torch so that it saves and exports with a model);
* :mod:`~meshops.reduced.gp`: Gaussian-process regression with one length scale per
  parameter, fitted by the marginal likelihood;
* :mod:`~meshops.reduced.ensemble`: an ensemble of MLPs trained on the modal
  coefficients with the relative L2 loss of the fields;
* :mod:`~meshops.reduced.transfer`: the modes on other points of the same geometry
  (linear moving least squares);

:func:`meshops.training.baselines.pod_rbf_baseline` (the classical baseline every
run is compared with) and the :class:`meshops.models.ReducedBasis` model are built
from them.
"""

from meshops.reduced.parameters import (
    batch_parameters,
    constant_channels,
    constant_inputs,
    global_channels,
    input_ranges,
    means_and_sizes,
    proportional_channel,
    sample_parameters,
)
from meshops.reduced.pod import PODBasis, pod_basis

__all__ = ["PODBasis", "batch_parameters", "constant_channels", "constant_inputs",
           "global_channels", "input_ranges", "means_and_sizes", "pod_basis",
           "proportional_channel",
           "sample_parameters"]
