"""The benchmark's data sets, written once as mesh folders and reused.

=================  ======================================================  ===========
name               what                                                    train/test
=================  ======================================================  ===========
navier_stokes      real: backward-facing step, 1 parameter, (vx, vy, p)    400 / 100
heat               real: transient heat as a parametric set, (mu0, mu1,    1600 / 400
                   step), every 5th step, split by trajectory (80 / 20)
convdiff           stand-in: convection-diffusion, 3 parameters            160 / 40
materials          stand-in: multi-material elasticity, 11 parameters,     400 / 100
                   displacement (u1, u2)
hole               stand-in: plate with a hole, 4 parameters, one mesh     240 / 60
                   per sample
boundary_layer     stand-in: convection-diffusion at Peclet 10-1000,       240 / 60
                   graded mesh
=================  ======================================================  ===========

Each is a :class:`data_adapters.parametric.ParametricSet` written by
:func:`data_adapters.parametric.prepare_parametric_folders` to ``ROOT/<name>/``
(``train/``, ``test/``, ``dataset.json``); a folder whose key matches is reused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from data_adapters.parametric import ParametricSet, prepare_parametric_folders
from data_adapters.standins.body3d import PARAMS as BODY3D_PARAMS
from data_adapters.standins.cavity3d import PARAMS as CAVITY3D_PARAMS

#: Name -> (key, builder). The key names everything the folder depends on.
_SPECS: dict[str, tuple[dict, Callable[[dict], ParametricSet]]] = {}


def _register(name: str, key: dict):
    def deco(fn):
        _SPECS[name] = ({"set": name, **key}, fn)
        return fn
    return deco


# version 2: the target fields velocity (vx, vy) and pressure, each its own error
@_register("navier_stokes", {"version": 2, "n_train": 400, "seed": 0})
def _navier_stokes(key):
    from data_adapters.fem_npz import navier_stokes_set

    ds = navier_stokes_set(n_train=key["n_train"], seed=key["seed"])
    ds.info["key"] = key
    ds.fields = ["vx+vy", "p"]
    return ds


@_register("heat", {"version": 1, "n_train": 80, "seed": 0, "every": 5})
def _heat(key):
    from data_adapters.fem_npz import heat_set

    ds = heat_set(n_train=key["n_train"], seed=key["seed"], every=key["every"])
    ds.info["key"] = key
    return ds


def _standin_set(name: str, module: str, factory: str, inputs: str, targets,
                 description: str, version: int = 1, fields=None, again=None) -> None:
    """Register stand-in ``name``: ``factory(samples, seed=...)`` of
    ``data_adapters.standins.<module>``, first ``samples - test`` for training; ``again``:
    ``{split: keywords}``, the test shapes meshed again by ``factory(samples, seed=...,
    first=samples - test, **keywords)`` (the mesh-independence suite)."""

    def build(key):
        import importlib

        mod = importlib.import_module(f"data_adapters.standins.{module}")
        make = getattr(mod, factory)
        samples = make(key["samples"], seed=key["seed"], dtype=torch.float64)
        target_names = getattr(mod, targets) if isinstance(targets, str) else targets
        n, n_test = len(samples), key["test"]
        extra = {split: make(n, seed=key["seed"], dtype=torch.float64, first=n - n_test, **kw)
                 for split, kw in (again or {}).items()}
        return ParametricSet(name, samples, list(getattr(mod, inputs)), list(target_names),
                             list(range(n - n_test)), list(range(n - n_test, n)),
                             description=description, info={"key": key, "standin": True},
                             fields=fields, extra=extra)

    sizes = {"convdiff": (200, 40), "materials": (500, 100)}.get(name, (300, 60))
    _register(name, {"version": version, "samples": sizes[0], "test": sizes[1], "seed": 0})(build)


_standin_set("convdiff", "convdiff", "make_convection_diffusion_standin", "INPUTS", ["u"],
             "STAND-IN: steady convection-diffusion on a 3,136-node unit square, parameters "
             "kappa, wind_x, wind_y (data_adapters.standins.convdiff).")
_standin_set("materials", "materials", "make_materials_standin", "INPUTS", "TARGETS",
             "STAND-IN: clamped multi-material plate in plane-strain elasticity, 11 parameters "
             "(8 Young's moduli, edge load and angle, top pressure), displacement (u1, u2) "
             "(data_adapters.standins.materials).", version=3,  # 2: angle in [-pi/2, pi/2]
             fields=["u1+u2"])  # 3: the displacement is one vector field
_standin_set("hole", "hole", "make_hole_standin", "INPUTS", ["u"],
             "STAND-IN: heated plate with a cooled hole whose centre and radius are "
             "parameters (one mesh per sample), Biot number on the sides "
             "(data_adapters.standins.hole); the test shapes meshed again: test_fine on "
             "about 4x the nodes, test_ring16 and test_ring64 with a 7.5 mm annulus around "
             "the hole refined 16x and 64x in area.", version=2,
             again={"test_fine": {"h": 0.025, "h_hole": 0.0075}, "test_ring16": {"ring": 16},
                    "test_ring64": {"ring": 64}})
_standin_set("boundary_layer", "boundary_layer", "make_boundary_layer_standin", "INPUTS", ["u"],
             "STAND-IN: convection-diffusion at Peclet 10 to 1,000 on a graded 3,185-node "
             "mesh, parameters eps and wind angle theta (data_adapters.standins.boundary_layer).")


def _family_set(name: str, description: str, build, inputs, targets, fields, params,
                sizes=(300, 60), version: int = 1) -> None:
    """Register a family of geometries ``name``: ``build(samples, seed)`` returns the
    samples (each its own mesh, with ``params [1, K]`` named ``params``) and optionally
    ``{split: samples}`` of more splits; the first ``samples - test`` train."""

    def make(key):
        samples, extra = build(key["samples"], key["seed"], key["test"])
        n, n_test = len(samples), key["test"]
        return ParametricSet(name, samples, list(params), list(targets),
                             list(range(n - n_test)), list(range(n - n_test, n)),
                             description=description, info={"key": key, "standin": True,
                                                            "family": True},
                             inputs=list(inputs), fields=list(fields), extra=extra)

    FAMILIES.append(name)
    _register(name, {"version": version, "samples": sizes[0], "test": sizes[1],
                     "seed": 0})(make)


#: The families of geometries (each sample its own mesh): the suite of issue 27.
FAMILIES: list[str] = ["hole"]


def _elasticity(n, seed, n_test):
    from data_adapters.standins.elasticity import make_elasticity_standin

    def make(**how):
        return make_elasticity_standin(n, seed=seed, dtype=torch.float64, void_distance=True,
                                       progress=False, **how)

    again = {"test_fine": {"h_void": 0.006, "h_outer": 0.0235}, "test_ring16": {"ring": 16},
             "test_ring64": {"ring": 64}}
    return make(), {split: make(first=n - n_test, **how) for split, how in again.items()}


#: The airfoil family's C-grid, and how its test shapes are meshed again (the same
#: settings re-mesh the validation shapes: :mod:`benchmarks.validation_remesh`).
AIRFOIL_GRID = {"n_side": 31, "n_wake": 15, "n1": 25}
AIRFOIL_AGAIN = {"test_fine": {"n_side": 61, "n_wake": 30, "n1": 49},
                 "test_wall": {"first_height": 0.0025}}
#: How the obstacle family's test shapes are meshed again.
OBSTACLE_AGAIN = {"test_fine": {"refine": 2}, "test_ring16": {"ring": 16},
                  "test_ring64": {"ring": 64}}


def airfoil_samples(n, seed, **how):
    """The airfoil family's draw of ``n`` shapes (``how``: the grid's changes, ``first``)."""
    from data_adapters.standins.airfoil import make_airfoil_standin

    return make_airfoil_standin(n, seed=seed, dtype=torch.float64, target=("u", "v", "cp"),
                                progress=False, **{**AIRFOIL_GRID, **how})


def _airfoil(n, seed, n_test):
    return airfoil_samples(n, seed), {split: airfoil_samples(n, seed, first=n - n_test, **how)
                                      for split, how in AIRFOIL_AGAIN.items()}


def _obstacle(n, seed, n_test):
    from data_adapters.standins.obstacle import make_obstacle_standin

    samples = make_obstacle_standin(n, seed=seed, dtype=torch.float64, progress=False)
    return samples, {split: make_obstacle_standin(n, seed=seed, dtype=torch.float64,
                                                  first=n - n_test, progress=False, **how)
                     for split, how in OBSTACLE_AGAIN.items()}


_family_set("elasticity", "STAND-IN: plane-strain unit cell with a random star-shaped void "
            "(one mesh per sample, about 1,000 nodes), input the distance to the void, "
            "target the von Mises stress (data_adapters.standins.elasticity); the test "
            "shapes meshed again: test_fine on about 4x the nodes, test_ring16 and "
            "test_ring64 with a 6 mm band around the void refined 16x and 64x in area.",
            _elasticity, ["void_distance"], ["sigma"], ["sigma"],
            ["r0", *(f"a{k}" for k in range(1, 6)), *(f"b{k}" for k in range(1, 6))],
            version=2)
_family_set("airfoil", "STAND-IN: potential flow past NACA 4-digit airfoils at -5 to 10 "
            "degrees on their own C-grids (2,275 nodes), inputs the free-stream direction "
            "and the distance to the airfoil, targets the velocity (u, v) and the pressure "
            "coefficient cp (data_adapters.standins.airfoil); the test shapes meshed again: "
            "test_fine on 3.9x the nodes, test_wall with the grid's rows packed 4x closer "
            "to the wall.",
            _airfoil, ["u_inf", "v_inf", "wall_distance"], ["u", "v", "cp"], ["u+v", "cp"],
            ["m", "p", "t", "alpha"], version=3)
_family_set("obstacle", "STAND-IN: steady viscous flow (Re 20-40) past a star-shaped "
            "obstacle whose shape and place vary, in a 4 m x 1 m channel, one mesh per sample "
            "(1,600 nodes), input the distance to the obstacle, targets the velocity (u, v) "
            "in m/s and the pressure p in Pa, about 100 times larger "
            "(data_adapters.standins.obstacle); the test shapes meshed again: test_fine on "
            "4x the nodes, test_ring16 and test_ring64 with a 1 cm band around the obstacle "
            "refined 16x and 64x in area.",
            _obstacle, ["sdf"], ["u", "v", "p"], ["u+v", "p"],
            ["cx", "cy", "r0", "a1", "a2", "a3", "b1", "b2", "b3"], version=2)



def _remeshed(module: str, factory: str, again: dict):
    """A family's ``build(samples, seed, test)``: ``factory`` of
    ``data_adapters.standins.<module>`` for the samples and, for each split of ``again``
    (``{split: keywords}``), for the test shapes alone meshed again."""

    def build(n, seed, n_test):
        import importlib

        make = getattr(importlib.import_module(f"data_adapters.standins.{module}"), factory)
        how = {"seed": seed, "dtype": torch.float64, "progress": False}
        return make(n, **how), {split: make(n, first=n - n_test, **how, **kw)
                                for split, kw in again.items()}

    return build


_family_set("cavity3d", "STAND-IN: 3-D linear elasticity of a 2 m x 1 m x 1 m steel block "
            "with one or two random ellipsoidal cavities, clamped at x = 0 and pulled at "
            "x = 2 m by a traction of random size and direction, each sample its own gmsh "
            "tetrahedral mesh (3,100-5,200 nodes); inputs the distance to the cavities and "
            "the load's size (Pa) and direction (angle, elevation) as constant fields, targets "
            "the displacement (ux, uy, uz) in m and the von Mises stress vm in Pa, about 5e10 "
            "times larger (data_adapters.standins.cavity3d); the test shapes meshed again: "
            "test_fine with every mesh size divided by 1.5 (about 3.4x the nodes), "
            "test_ring16 with a 17.5 mm band at the cavities refined 16x in volume.",
            _remeshed("cavity3d", "make_cavity3d_standin",
                      {"test_fine": {"refine": 1.5}, "test_ring16": {"ring": 16}}),
            ["sdf", "load", "angle", "elevation"], ["ux", "uy", "uz", "vm"],
            ["ux+uy+uz", "vm"], CAVITY3D_PARAMS)


_family_set("body3d", "STAND-IN: 3-D potential flow past random closed bodies (an ellipsoid "
            "0.5-1.5 long and 0.2-0.5 across with three smooth bumps, slightly turned) in a "
            "unit stream at angle of attack alpha and sideslip beta within 15 degrees, solved "
            "by a panel method; the body's surface as triangles in space, each sample its own "
            "mesh (1,543 nodes: gmsh's sphere turned at random and mapped onto the body); "
            "inputs the outward normal (nx, ny, nz) and alpha, beta (rad) as constant fields, "
            "targets the pressure coefficient cp and the surface velocity (vx, vy, vz) "
            "(data_adapters.standins.body3d); the test shapes meshed again: test_fine with "
            "the sphere's edge halved (about 4x the nodes), test_graded with a cap round the "
            "front stagnation point refined 16x in area.",
            _remeshed("body3d", "make_body3d_standin",
                      {"test_fine": {"refine": 2}, "test_graded": {"ring": 16}}),
            ["nx", "ny", "nz", "alpha", "beta"], ["cp", "vx", "vy", "vz"],
            ["cp", "vx+vy+vz"], BODY3D_PARAMS)

NAMES = tuple(_SPECS)


def prepare(name: str, root, progress: bool = True) -> Path:
    """The folder of data set ``name`` under ``root`` (written on first use)."""
    if name not in _SPECS:
        raise KeyError(f"unknown data set {name!r}; choose from {', '.join(NAMES)}")
    key, build = _SPECS[name]
    return prepare_parametric_folders(Path(root) / name, lambda: build(key), key,
                                      progress=progress)
