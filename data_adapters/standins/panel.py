"""Hess-Smith panel method for 2-D potential flow past a closed body.

Constant-strength source panels (one strength per panel) plus one vortex sheet of
uniform strength ``gamma`` on all panels, flat panels between the contour points.
Unknowns: the ``K`` source strengths and ``gamma``; equations: zero normal velocity
at the ``K`` panel midpoints and the Kutta condition (equal and opposite tangential
velocity on the two trailing-edge panels). The circulation is
``Gamma = gamma * perimeter`` (clockwise positive) and, by Kutta-Joukowski, the lift
coefficient ``Cl = 2 Gamma / (V_inf c)``.

Influence of a panel from ``A`` to ``B`` (length ``L``, unit tangent ``t``, left
normal ``n``) at a point with panel coordinates ``(xi, eta)``, per unit strength:
source ``(ln(r1 / r2), beta) / (2 pi)`` and clockwise vortex ``(beta, -ln(r1 / r2)) / (2 pi)``
in ``(t, n)`` components, with ``r1 = |P - A|``, ``r2 = |P - B|`` and ``beta`` the angle
the panel subtends at the point.

Everything is vectorised with numpy; field velocities are evaluated in blocks of
points so memory stays bounded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshops.errors import MeshError

_BLOCK = 4096  # field points per block in the velocity sum


def _panel_frames(nodes: np.ndarray):
    a, b = nodes[:-1], nodes[1:]
    d = b - a
    length = np.hypot(d[:, 0], d[:, 1])
    if not (length > 0).all():
        k = int(np.flatnonzero(~(length > 0))[0])
        raise MeshError(f"panel method: panel {k} has zero length (repeated contour point)")
    t = d / length[:, None]
    n = np.stack([-t[:, 1], t[:, 0]], axis=1)
    return a, b, length, t, n


def _log_beta(points: np.ndarray, a, length, t, n):
    """``ln(r1 / r2)`` and the subtended angle ``beta``, each ``[M, K]``."""
    dx = points[:, None, 0] - a[None, :, 0]
    dy = points[:, None, 1] - a[None, :, 1]
    xi = dx * t[None, :, 0] + dy * t[None, :, 1]
    eta = dx * n[None, :, 0] + dy * n[None, :, 1]
    r1 = xi * xi + eta * eta
    xl = xi - length
    log = 0.5 * np.log(r1 / (xl * xl + eta * eta))
    # angle between P - A and P - B, in (-pi, pi]: the panel's subtended angle
    beta = np.arctan2(eta * length, xi * xl + eta * eta)
    return log, beta


def _influence(points: np.ndarray, a, length, t, n):
    """Source and vortex velocities ``[M, K, 2]`` (global frame) per unit strength."""
    log, beta = _log_beta(points, a, length, t, n)
    c = 1.0 / (2 * np.pi)
    src = c * (log[..., None] * t[None] + beta[..., None] * n[None])
    vor = c * (beta[..., None] * t[None] - log[..., None] * n[None])
    return src, vor


@dataclass
class PanelSolution:
    """Solution of :func:`solve_panels`.

    Attributes:
        nodes: Contour ``[K + 1, 2]`` (closed: first = last).
        alpha: Angle of attack in radians (free stream ``V_inf (cos a, sin a)``).
        v_inf: Free-stream speed.
        q: Source strengths ``[K]``.
        gamma: Vortex-sheet strength (clockwise positive; 0 if not lifting).
        vt: Tangential velocity at the panel midpoints ``[K]`` (along the panel
            direction, i.e. clockwise round the body).
        circulation: ``gamma * perimeter`` (clockwise positive).
        chord: Reference chord used for ``cl``.
    """

    nodes: np.ndarray
    alpha: float
    v_inf: float
    q: np.ndarray
    gamma: float
    vt: np.ndarray
    circulation: float
    chord: float

    @property
    def cl(self) -> float:
        """Lift coefficient from Kutta-Joukowski, ``2 Gamma / (V_inf c)``."""
        return 2.0 * self.circulation / (self.v_inf * self.chord)

    @property
    def freestream(self) -> np.ndarray:
        return self.v_inf * np.array([np.cos(self.alpha), np.sin(self.alpha)])

    def velocity(self, points) -> np.ndarray:
        """Velocity ``[M, 2]`` at points off the contour (sum of all panel influences).

        Points on the contour itself (the panel ends) are singular for flat panels;
        use :meth:`surface_velocity` there.

        Shapes:
            points ``[M, 2]`` -> ``[M, 2]``
        """
        p = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        a, _, length, t, n = _panel_frames(self.nodes)
        out = np.empty_like(p)
        c = 1.0 / (2 * np.pi)
        for s in range(0, len(p), _BLOCK):
            log, beta = _log_beta(p[s:s + _BLOCK], a, length, t, n)
            # per panel: (q log + gamma beta) t + (q beta - gamma log) n
            ct = c * (log * self.q + self.gamma * beta)
            cn = c * (beta * self.q - self.gamma * log)
            out[s:s + _BLOCK] = self.freestream + ct @ t + cn @ n
        return out

    def surface_velocity(self) -> np.ndarray:
        """Velocity ``[K + 1, 2]`` at the contour points: the mean of the two adjacent
        panels' midpoint velocities (tangential, ``vt * t``); the trailing-edge point
        (first = last) averages the two trailing-edge panels.

        Shapes:
            -> ``[K + 1, 2]``
        """
        _, _, _, t, _ = _panel_frames(self.nodes)
        v = self.vt[:, None] * t  # [K, 2]
        node = 0.5 * (v + np.roll(v, 1, axis=0))  # node k between panels k-1 and k
        return np.concatenate([node, node[:1]], axis=0)


def solve_panels(nodes, alpha: float, v_inf: float = 1.0, lifting: bool = True,
                 chord: float = 1.0) -> PanelSolution:
    """Solve the Hess-Smith panel method for a closed contour.

    Args:
        nodes: Closed contour ``[K + 1, 2]`` (first = last point), clockwise: from the
            trailing edge along the lower surface, round the leading edge, back along
            the upper surface (as :func:`data_adapters.standins.naca4.naca4` gives it).
        alpha: Angle of attack in radians.
        v_inf: Free-stream speed.
        lifting: Include the vortex sheet and the Kutta condition; ``False`` gives the
            non-lifting (source-only) solution, e.g. for a circular cylinder.
        chord: Reference length for the lift coefficient.

    Returns:
        :class:`PanelSolution`.

    Shapes:
        nodes ``[K + 1, 2]``
    """
    nodes = np.asarray(nodes, dtype=np.float64)
    if nodes.ndim != 2 or nodes.shape[1] != 2 or len(nodes) < 4:
        raise MeshError(f"panel method: nodes must be [K + 1, 2] with K >= 3, got "
                        f"{tuple(nodes.shape)}")
    if not np.allclose(nodes[0], nodes[-1], rtol=0, atol=1e-12):
        raise MeshError("panel method: the contour must be closed (first point = last point)")
    a, _, length, t, n = _panel_frames(nodes)
    k = len(length)
    mid = 0.5 * (nodes[:-1] + nodes[1:])
    src, vor = _influence(mid, a, length, t, n)
    # Self-influence from the outside (the flow side): beta = pi, log = 0.
    i = np.arange(k)
    src[i, i] = 0.5 * n
    vor[i, i] = 0.5 * t
    vinf = v_inf * np.array([np.cos(alpha), np.sin(alpha)])
    a_src_n = np.einsum("ikc,ic->ik", src, n)
    a_src_t = np.einsum("ikc,ic->ik", src, t)
    if lifting:
        a_vor_n = np.einsum("ikc,ic->i", vor, n)
        a_vor_t = np.einsum("ikc,ic->i", vor, t)
        mat = np.zeros((k + 1, k + 1))
        rhs = np.zeros(k + 1)
        mat[:k, :k] = a_src_n
        mat[:k, k] = a_vor_n
        rhs[:k] = -n @ vinf
        # Kutta: vt on the first and last panel equal and opposite.
        mat[k, :k] = a_src_t[0] + a_src_t[-1]
        mat[k, k] = a_vor_t[0] + a_vor_t[-1]
        rhs[k] = -(t[0] + t[-1]) @ vinf
        sol = np.linalg.solve(mat, rhs)
        q, gamma = sol[:k], float(sol[k])
        vt = a_src_t @ q + gamma * a_vor_t + t @ vinf
    else:
        q = np.linalg.solve(a_src_n, -n @ vinf)
        gamma = 0.0
        vt = a_src_t @ q + t @ vinf
    return PanelSolution(nodes=nodes, alpha=float(alpha), v_inf=float(v_inf), q=q,
                         gamma=gamma, vt=vt, circulation=gamma * float(length.sum()),
                         chord=float(chord))
