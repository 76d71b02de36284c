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
* Harder parametric stand-ins (P1 FEM, parameters as constant input fields):
  :func:`make_materials_standin` (multi-material plate in plane-strain elasticity,
  11 parameters, displacement ``(u1, u2)``), :func:`make_hole_standin` (heated plate
  with a cooled hole whose position and radius are parameters: one mesh per sample)
  and :func:`make_boundary_layer_standin` (convection-diffusion at Peclet 10 to
  1,000 on a graded mesh: boundary layers of thickness ``eps``).

Both are deterministic in their seed and cached on disk (``cache_dir``, else
``$MESHOPS_CACHE/standins``, else ``~/.cache/meshops/standins``). The solver
pieces (:mod:`.fem`, :mod:`.panel`, :mod:`.naca4`, :mod:`.cgrid`) are importable on
their own. Heavy dependencies (scikit-fem, triangle) are imported only when a
solver runs.
"""

from data_adapters.standins.airfoil import local_mach, make_airfoil_standin
from data_adapters.standins.boundary_layer import make_boundary_layer_standin
from data_adapters.standins.cgrid import c_grid
from data_adapters.standins.convdiff import make_convection_diffusion_standin
from data_adapters.standins.elasticity import make_elasticity_standin, mesh_unit_cell, void_radius
from data_adapters.standins.hole import make_hole_standin
from data_adapters.standins.materials import make_materials_standin
from data_adapters.standins.naca4 import naca4
from data_adapters.standins.panel import PanelSolution, solve_panels

__all__ = ["make_elasticity_standin", "make_airfoil_standin", "make_convection_diffusion_standin",
           "make_materials_standin", "make_hole_standin", "make_boundary_layer_standin",
           "naca4", "c_grid",
           "solve_panels", "PanelSolution", "local_mach", "mesh_unit_cell", "void_radius"]
