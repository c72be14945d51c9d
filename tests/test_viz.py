"""ascender_torch.viz: the variance shares against a hand computation, and both figures rendered
as PNG files from a tiny model."""

import pytest
import torch
from torch import nn

from ascender_torch import ASCenderAttention, ASCenderHead
from ascender_torch import viz

pytest.importorskip("matplotlib")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_variance_shares_match_a_hand_computation():
    # one batch, two heads, three tokens, causal: row 0 has one key (left out), rows 1 and 2 count
    S = torch.tensor([[0.0, 9.0, 9.0], [1.0, 3.0, 9.0], [0.0, 0.0, 3.0]])
    b = torch.tensor([[5.0, 5.0, 5.0], [-1.0, 1.0, 7.0], [1.0, -2.0, 1.0]])
    maps = {"S_base": torch.stack([S, S])[None], "b_align": torch.stack([b, b])[None],
            "b_sep": torch.stack([b, torch.zeros(3, 3)])[None], "b_coh": torch.zeros(1, 2, 3, 3),
            "omega": torch.tensor([[1.0, 0.5, 0.3], [2.0, 0.0, 0.0]]), "visible": viz.visible_keys(1, 3, True)}
    # head 0, row 1 (keys 0, 1): Var(S) = 1, Var(1*b) = 1, Var(0.5*b) = 0.25, Var(0) = 0
    # row 2 (keys 0..2): S = (0, 0, 3): Var 2; b = (1, -2, 1): Var 2; 0.5 b: Var 0.5
    row1 = torch.tensor([1.0, 1.0, 0.25, 0.0]) / 2.25
    row2 = torch.tensor([2.0, 2.0, 0.5, 0.0]) / 4.5
    # head 1: align omega 2 -> Var 4 (row 1), 8 (row 2); sep omega 0
    row1h, row2h = torch.tensor([1.0, 4.0, 0.0, 0.0]) / 5, torch.tensor([2.0, 8.0, 0.0, 0.0]) / 10
    expected = torch.stack([(row1 + row2) / 2, (row1h + row2h) / 2])
    shares = viz.variance_shares(maps)
    assert torch.allclose(shares, expected, atol=1e-6)
    assert torch.allclose(shares.sum(-1), torch.ones(2))


def test_variance_shares_of_a_module_follow_its_omegas():
    torch.manual_seed(0)
    attention = ASCenderAttention(16, 2, k=3)
    with torch.no_grad():
        attention.omega_sep.copy_(torch.tensor([0.0, 3.0]))
    shares = viz.variance_shares(viz.attention_maps(attention, torch.randn(2, 10, 16), is_causal=True))
    assert shares[0, 2] == 0.0 and shares[1, 2] > 0.5  # a head with omega_sep = 3 is dominated by sep


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.layers = nn.ModuleList(ASCenderAttention(16, 2, k=3) for _ in range(2))

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = x + layer(x, is_causal=True)[0]
        return x


def _assert_png(path):
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_SIGNATURE)


def test_figures_are_written_as_png(tmp_path):
    torch.manual_seed(0)
    model = TinyLM()
    tokens = torch.randint(0, 20, (1, 8))
    per_layer = viz.layer_maps(model, lambda: model(tokens))
    assert len(per_layer) == 2 and per_layer[1]["S_base"].shape == (1, 2, 8, 8)
    # the second layer's maps come from its real input (the first layer's output), not the embedding;
    # computed without autograd, as layer_maps runs the model (the same kernel: docs/decode.md)
    with torch.no_grad():
        x1 = model.layers[0](model.embed(tokens), is_causal=True)[0] + model.embed(tokens)
    direct = viz.attention_maps(model.layers[1], x1, is_causal=True)
    assert torch.allclose(per_layer[1]["A"], direct["A"], atol=1e-6)
    fig1, fig4 = tmp_path / "fig1.png", tmp_path / "fig4.png"
    viz.plot_decomposition(per_layer[0], fig1, head=1, tokens=list("abcdefgh"))
    shares = torch.stack([viz.variance_shares(m) for m in per_layer])
    viz.plot_head_specialization(shares, fig4)
    _assert_png(fig1)
    _assert_png(fig4)


def test_single_head_module_maps(tmp_path):
    torch.manual_seed(0)
    head = ASCenderHead(12, 8, k=3, variant="paper")
    maps = viz.attention_maps(head, torch.randn(1, 6, 12))
    assert maps["A"].shape == (1, 1, 6, 6) and torch.allclose(maps["A"].sum(-1), torch.ones(1, 1, 6))
    viz.plot_decomposition(maps, tmp_path / "head.png")
    _assert_png(tmp_path / "head.png")
    with pytest.raises(TypeError):
        viz.attention_maps(nn.Linear(3, 3), torch.randn(1, 2, 3))
