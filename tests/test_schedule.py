"""ascender_torch.schedule: the warm-up recipe's multipliers and what it does to parameters,
gradients, optimizer state and state_dicts."""

import pytest
import torch
from torch import nn

from ascender_torch import ASCenderAttention, ASCenderHead
from ascender_torch.schedule import ASCenderSchedule, multipliers


def test_multipliers_follow_the_recipe():
    # 100 steps, separation from step 15, ramps of 10 steps
    assert multipliers(0, 100) == {"align": 0.0, "sep": 0.0, "coh": 0.0}
    assert multipliers(5, 100) == pytest.approx({"align": 0.5, "sep": 0.0, "coh": 0.5})
    assert multipliers(14, 100) == pytest.approx({"align": 1.0, "sep": 0.0, "coh": 1.0})
    assert multipliers(15, 100)["sep"] == 0.0
    assert multipliers(20, 100)["sep"] == pytest.approx(0.5)
    assert multipliers(25, 100) == {"align": 1.0, "sep": 1.0, "coh": 1.0}
    assert multipliers(99, 100) == {"align": 1.0, "sep": 1.0, "coh": 1.0}
    # no ramp: align/coh on at once, sep switches at its start
    assert multipliers(0, 10, sep_start=0.5, ramp=0.0) == {"align": 1.0, "sep": 0.0, "coh": 1.0}
    assert multipliers(5, 10, sep_start=0.5, ramp=0.0)["sep"] == 1.0
    with pytest.raises(ValueError):
        multipliers(0, 0)
    with pytest.raises(ValueError):
        multipliers(0, 10, sep_start=1.5)


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = ASCenderAttention(16, 2, k=3)
        self.b = ASCenderHead(16, 8, k=3, variant="paper")

    def forward(self, x):
        y, _ = self.a(x, is_causal=True)
        out, _, _ = self.b(y, need_weights=False, is_causal=True)
        return out


def test_effective_omega_is_multiplier_times_learned_value():
    model = TwoLayers()
    with torch.no_grad():
        model.a.omega_sep.copy_(torch.tensor([0.3, -0.2]))
    raw = model.a.omega_sep
    schedule = ASCenderSchedule(model, total_steps=100)
    assert torch.equal(model.a.omega_sep, torch.zeros(2))  # sep off at step 0
    assert model.a.parametrizations.omega_sep.original is raw  # the same Parameter object
    schedule.step(20)
    assert torch.allclose(model.a.omega_sep, 0.5 * torch.tensor([0.3, -0.2]))
    assert torch.allclose(model.b.omega_c, torch.tensor(0.1))
    schedule.step(50)
    assert torch.allclose(model.a.omega_sep, torch.tensor([0.3, -0.2]))
    schedule.remove()
    assert model.a.omega_sep is raw and isinstance(model.a, ASCenderAttention)
    assert set(model.state_dict()) == set(TwoLayers().state_dict())


def test_training_keeps_separation_frozen_then_learns_it():
    torch.manual_seed(0)
    model = TwoLayers()
    params = dict(model.named_parameters())  # before attaching: the optimizer holds these objects
    optimizer = torch.optim.Adam(params.values(), lr=1e-2)
    schedule = ASCenderSchedule(model, total_steps=20, sep_start=0.25, ramp=0.1)
    sep0 = (params["a.omega_sep"].detach().clone(), params["b.omega_s"].detach().clone())
    align0 = params["a.omega_align"].detach().clone()
    x, target = torch.randn(2, 9, 16), torch.randn(2, 9, 8)
    for t in range(20):
        m = schedule.step(t)
        loss = (model(x) - target).square().mean()
        optimizer.zero_grad()
        loss.backward()
        if m["sep"] == 0.0:
            assert torch.count_nonzero(params["a.omega_sep"].grad) == 0
            assert torch.count_nonzero(params["b.omega_s"].grad) == 0
        optimizer.step()
        if t == 4:  # step 5 is the first with sep on
            assert torch.equal(params["a.omega_sep"], sep0[0]) and torch.equal(params["b.omega_s"], sep0[1])
            assert not torch.equal(params["a.omega_align"], align0)
    assert not torch.equal(params["a.omega_sep"].detach(), sep0[0])  # learned after the warm-up
    schedule.remove()
    assert dict(model.named_parameters())["a.omega_sep"] is params["a.omega_sep"]


def test_gradient_reaching_omega_is_scaled_by_the_multiplier():
    torch.manual_seed(1)
    model = ASCenderAttention(16, 2, k=3)
    x = torch.randn(1, 7, 16)
    model(x, is_causal=True)[0].sum().backward()
    full = model.omega_coh.grad.clone()
    model.zero_grad()
    schedule = ASCenderSchedule(model, total_steps=10, ramp=0.5)
    schedule.step(1)  # m_coh = 1/5: effective omega_coh is 0.02, its gradient 1/5 of the unscaled one there
    model(x, is_causal=True)[0].sum().backward()
    scaled = model.parametrizations.omega_coh.original.grad
    schedule.remove()
    with torch.no_grad():
        model.omega_coh.mul_(0.2)
        model.omega_align.mul_(0.2)
        model.omega_sep.zero_()
    model.zero_grad()
    model(x, is_causal=True)[0].sum().backward()
    assert torch.allclose(scaled, 0.2 * model.omega_coh.grad, rtol=1e-4, atol=1e-7)
    assert not torch.allclose(scaled, full)


def test_a_model_without_ascender_is_rejected():
    with pytest.raises(ValueError, match="no module with omega"):
        ASCenderSchedule(nn.Linear(3, 3), total_steps=10)
