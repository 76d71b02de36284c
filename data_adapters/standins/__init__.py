"""Offline **stand-ins** for the Geo-FNO benchmarks (synthetic data, not the benchmarks).

* :func:`make_elasticity_standin`: unit cell with a random star-shaped void under
  tension, plane-strain linear elasticity by P1 FEM (scikit-fem), target the nodal
  von Mises stress ``"sigma"``.
* :func:`make_airfoil_standin`: NACA 4-digit airfoils at varying angle of attack on
  an algebraic C-grid, Hess-Smith panel-method flow, target an approximate local
  Mach number ``"mach"``.
* :func:`make_convection_diffusion_standin`: steady convection-diffusion on one
  fixed mesh with three scalar parameters as constant input fields (P1 FEM), the
  parametric data a new user brings to ``meshops train``.

Both are deterministic in their seed and cached on disk (``cache_dir``, else
``$MESHOPS_CACHE/standins``, else ``~/.cache/meshops/standins``). The solver
pieces (:mod:`.fem`, :mod:`.panel`, :mod:`.naca4`, :mod:`.cgrid`) are importable on
their own. Heavy dependencies (scikit-fem, triangle) are imported only when a
solver runs.
"""

from data_adapters.standins.airfoil import local_mach, make_airfoil_standin
from data_adapters.standins.cgrid import c_grid
from data_adapters.standins.convdiff import make_convection_diffusion_standin
from data_adapters.standins.elasticity import make_elasticity_standin, mesh_unit_cell, void_radius
from data_adapters.standins.naca4 import naca4
from data_adapters.standins.panel import PanelSolution, solve_panels

__all__ = ["make_elasticity_standin", "make_airfoil_standin", "make_convection_diffusion_standin",
           "naca4", "c_grid",
           "solve_panels", "PanelSolution", "local_mach", "mesh_unit_cell", "void_radius"]
