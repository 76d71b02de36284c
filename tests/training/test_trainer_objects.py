"""The Trainer with an optimizer, scheduler and loss built by the user: they are the
ones used, their states resume, and combinations that cannot work are refused."""

from __future__ import annotations

import pytest
import torch
from _meshes import square_mesh
from torch import nn

from meshops.mesh.io import mesh_from_arrays
from meshops.models import NeuralOperator, register_model
from meshops.training import RelativeLpLoss, Trainer, assemble, prepare_batch
from meshops.training.dataset import make_loader
from meshops.training.seed import seed_everything


@register_model("_test_trainer_objects")
class PointwiseOperator(NeuralOperator):
    """A pointwise MLP of ``[x, pos]``; raises after ``fail_after`` training calls (a
    killed run)."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.fail_after: int | None = None
        self.calls = 0

    def forward(self, data):
        if self.training:
            self.calls += 1
            if self.fail_after is not None and self.calls > self.fail_after:
                raise RuntimeError("killed")
        return self.net(torch.cat([data.x, data.pos.to(data.x.dtype)], -1))


def samples(n: int = 4) -> list:
    out = []
    for i in range(n):
        pts, cells = square_mesh(4 + i % 2, "triangle", amount=0.2, seed=i)
        a = torch.from_numpy(pts[:, 0] + (i + 1) * pts[:, 1])
        mesh = mesh_from_arrays(pts, cells, {"a": a, "u": a ** 2 + 1})
        out.append(assemble(mesh, ["a"], ["u"], torch.float64))
    return out


def model(seed: int = 0) -> PointwiseOperator:
    seed_everything(seed)
    return PointwiseOperator().double()


def weights(m: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.parameters()]


KW = dict(batch_size=2, seed=1, device="cpu", progress=False, log=None, normalize=False)


def test_a_user_optimizer_is_the_one_that_steps():
    """SGD with lr 0 leaves every weight exactly where it was; the default AdamW on
    the same data moves them (so the first check is not vacuous)."""
    data = samples()
    m = model()
    before = weights(m)
    sgd = torch.optim.SGD(m.parameters(), lr=0.0)
    trainer = Trainer(m, data, epochs=2, optimizer=sgd, scheduler=None, **KW)
    trainer.fit()
    assert trainer.optimizer is sgd
    assert all(torch.equal(a, b) for a, b in zip(before, weights(m)))

    control = model()
    Trainer(control, data, epochs=2, **KW).fit()
    assert any(not torch.equal(a, b) for a, b in zip(before, weights(control)))


def test_an_optimizer_factory_gets_the_trainable_parameters_and_takes_the_step():
    """One full-batch step of SGD(lr=0.1) from a factory: w1 = w0 - 0.1 grad, with the
    gradient of the relative L2 loss computed here on a copy of the model."""
    data = samples()
    m = model()
    m.net[0].bias.requires_grad_(False)  # frozen: the factory must not receive it
    ref = model()
    ref.net[0].bias.requires_grad_(False)
    got = []

    def factory(params):
        got.extend(params)
        return torch.optim.SGD(params, lr=0.1)

    trainer = Trainer(m, data, epochs=1, optimizer=factory, scheduler=None,
                      **{**KW, "batch_size": len(data)})
    assert {id(p) for p in got} == {id(p) for p in m.parameters() if p.requires_grad}
    assert len(got) == 3
    trainer.fit()

    batch = prepare_batch(next(iter(make_loader(data, len(data)))))
    loss = RelativeLpLoss()(ref(batch), batch.y, batch.weight, batch.batch)
    loss.backward()
    for p_ref, p in zip(ref.parameters(), m.parameters()):
        expected = p_ref.detach() - 0.1 * p_ref.grad if p_ref.requires_grad else p_ref.detach()
        torch.testing.assert_close(p.detach(), expected, rtol=0, atol=1e-13)


def test_a_custom_loss_is_called_and_its_value_logged():
    """With weights held fixed (SGD, lr 0) and one batch per epoch, the logged
    train_loss is exactly the custom loss of the model on all samples."""
    data = samples()
    m = model()
    calls = []

    def weighted_sse(pred, target, weight, batch):
        calls.append(int(batch.max()) + 1)
        return (weight[:, None] * (pred - target) ** 2).sum()

    history = Trainer(m, data, epochs=2, optimizer=torch.optim.SGD(m.parameters(), lr=0.0),
                      scheduler=None, loss=weighted_sse,
                      **{**KW, "batch_size": len(data)}).fit()
    assert calls == [len(data), len(data)]
    batch = prepare_batch(next(iter(make_loader(data, len(data)))))
    with torch.no_grad():
        expected = float((batch.weight[:, None] * (m(batch) - batch.y) ** 2).sum())
    for h in history:
        assert h["train_loss"] == pytest.approx(expected, rel=1e-12)


def test_a_user_scheduler_is_the_one_stepped():
    """StepLR(step 1, gamma 0.5) on SGD(lr 0.1), stepped once per batch (2 per epoch):
    the rate at the end of epoch e is 0.1 * 0.5 ** (2 e)."""
    data = samples()
    m = model()
    sgd = torch.optim.SGD(m.parameters(), lr=0.1)
    step = torch.optim.lr_scheduler.StepLR(sgd, step_size=1, gamma=0.5)
    trainer = Trainer(m, data, epochs=3, optimizer=sgd, scheduler=step, **KW)
    history = trainer.fit()
    assert trainer.scheduler is step and trainer.steps_per_epoch == 2
    assert [h["lr"] for h in history] == pytest.approx([0.1 * 0.5 ** (2 * e) for e in (1, 2, 3)],
                                                       rel=1e-12)


def _objects(m):
    sgd = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return sgd, torch.optim.lr_scheduler.StepLR(sgd, step_size=3, gamma=0.5)


def test_a_run_with_user_objects_resumes_to_the_uninterrupted_result(tmp_path):
    """Killed in epoch 3 of 4 and resumed with fresh SGD (momentum) and StepLR objects
    and another initial model: the momentum buffers and the schedule come from
    last.pt, so the weights end where the uninterrupted run's do."""
    data = samples()
    ref = model()
    sgd, sched = _objects(ref)
    ref_hist = Trainer(ref, data, epochs=4, optimizer=sgd, scheduler=sched,
                       out_dir=tmp_path / "ref", **KW).fit()

    cut = model()
    cut.fail_after = 5  # 2 steps per epoch: dies in epoch 3, last.pt holds epoch 2
    sgd, sched = _objects(cut)
    with pytest.raises(RuntimeError, match="killed"):
        Trainer(cut, data, epochs=4, optimizer=sgd, scheduler=sched, out_dir=tmp_path / "cut",
                **KW).fit()

    resumed = model(seed=7)
    sgd, sched = _objects(resumed)
    trainer = Trainer(resumed, data, epochs=4, optimizer=sgd, scheduler=sched,
                      out_dir=tmp_path / "cut", resume=True, **KW)
    hist = trainer.fit()
    assert [h["epoch"] for h in hist] == [1, 2, 3, 4]
    assert [h["lr"] for h in hist] == [h["lr"] for h in ref_hist]
    for a, b in zip(weights(ref), weights(resumed)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert all(torch.is_tensor(sgd.state[p]["momentum_buffer"]) for p in resumed.parameters())

    # Resuming the SGD run with another kind of optimiser is refused by name.
    other = model()
    with pytest.raises(ValueError, match=r"saved with optimizer SGD, cannot resume it with Adam"):
        Trainer(other, data, epochs=4, optimizer=torch.optim.Adam(other.parameters()),
                scheduler=None, out_dir=tmp_path / "cut", resume=True, **KW).fit()


def test_bad_combinations_are_refused_naming_the_problem():
    data = samples()
    m, stranger = model(), model(seed=3)
    own = torch.optim.SGD(m.parameters(), lr=0.1)
    cases = [
        (dict(optimizer=torch.optim.SGD(stranger.parameters(), lr=0.1)), ValueError,
         r"the SGD optimizer holds 4 parameter\(s\) that are not the model's \(shapes "
         r"\[8, 3\], \[8\], \[1, 8\], \.\.\.\)"),
        (dict(optimizer=torch.optim.SGD(list(m.parameters()) + [nn.Parameter(torch.ones(2))],
                                        lr=0.1)), ValueError, r"holds 1 parameter\(s\).*\[2\]"),
        (dict(optimizer=own, lr=1e-2), ValueError,
         "lr configure the optimizers named by a string; set them on the optimizer"),
        (dict(optimizer=lambda params: torch.optim.SGD(params, lr=0.1), weight_decay=0.0),
         ValueError, "weight_decay configure the optimizers named by a string"),
        (dict(optimizer=lambda params: "sgd"), TypeError,
         "the optimizer factory .*<lambda> returned a str, not a torch.optim.Optimizer"),
        (dict(optimizer=3), TypeError, "optimizer must be .* got a int"),
        (dict(optimizer="sgd"), ValueError, "optimizer must be 'adamw', 'adam', .* got 'sgd'"),
        (dict(optimizer=own, scheduler=torch.optim.lr_scheduler.StepLR(
            torch.optim.SGD(m.parameters(), lr=0.1), 1)), ValueError,
         r"the scheduler \(StepLR\) steps another optimizer than the trainer's"),
        (dict(scheduler=torch.optim.lr_scheduler.StepLR(own, 1)), ValueError,
         "a scheduler object needs the optimizer object it was built on, passed as "
         "optimizer=; with a named optimizer or a factory, pass a scheduler factory"),
        (dict(optimizer=own, scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(own)),
         ValueError, "ReduceLROnPlateau, which steps on a metric"),
        (dict(scheduler=lambda opt, total: torch.optim.lr_scheduler.StepLR(
            torch.optim.SGD(m.parameters(), lr=0.1), 1)), ValueError,
         r"the scheduler factory .*<lambda> \(StepLR\) steps another optimizer"),
        (dict(optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
              scheduler=torch.optim.lr_scheduler.StepLR(own, 1)), ValueError,
         "a scheduler object needs the optimizer object it was built on"),
        (dict(scheduler="linear"), ValueError, "scheduler must be 'cosine', 'onecycle', None"),
        (dict(scheduler=0.5), TypeError, "scheduler must be .*; the scheduler is a float"),
        (dict(loss="l2"), TypeError, "loss must be a callable"),
    ]
    for kw, error, message in cases:
        with pytest.raises(error, match=message):
            Trainer(m, data, epochs=1, **{**KW, **kw})


def test_a_loss_that_is_not_a_scalar_is_refused_naming_its_shape():
    data = samples()
    with pytest.raises(ValueError, match=r"returned a tensor of shape \(2,\); it must return "
                                         r"a scalar tensor"):
        Trainer(model(), data, epochs=1, loss=RelativeLpLoss(reduction="none"), **KW).fit()


def test_onecycle_peaks_at_the_rate_of_a_user_optimizer():
    """``"onecycle"`` takes its peak from the optimiser passed (lr= is not allowed with
    one) and starts at peak / 25, OneCycleLR's default div_factor."""
    data = samples()
    m = model()
    sgd = torch.optim.SGD(m.parameters(), lr=0.3)
    trainer = Trainer(m, data, epochs=2, optimizer=sgd, scheduler="onecycle", **KW)
    assert type(trainer.scheduler).__name__ == "OneCycleLR"
    assert sgd.param_groups[0]["max_lr"] == 0.3
    assert sgd.param_groups[0]["lr"] == pytest.approx(0.3 / 25, rel=1e-15)
    assert trainer.scheduler.total_steps == 4


def test_the_named_adamw_is_torchs_fused_kernel_and_takes_its_reference_steps():
    # "adamw" by name runs torch's fused kernel on the CPU (one call over every
    # parameter, where the per-tensor loop was a twentieth of a small model's step); the
    # steps are those of the per-tensor reference implementation, in float64 to rounding.
    data = samples()
    m, ref = model(), model()
    trainer = Trainer(m, data, None, epochs=2, lr=1e-2, weight_decay=1e-4, scheduler=None,
                      **KW)
    assert trainer.optimizer.defaults["fused"] is True
    trainer.fit()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=1e-4, foreach=False)
    reference = Trainer(ref, data, None, epochs=2, optimizer=opt, scheduler=None, **KW)
    reference.fit()
    for a, b in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    assert not torch.equal(weights(m)[0], weights(model())[0])  # it trained
