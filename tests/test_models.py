"""The plain nets: shapes, options, and that they are ordinary nn.Modules."""

import pytest
import torch
from torch import nn

from kindling.models.blocks import ConvStem, SelfAttention, as_steps, steps_per_patch
from kindling.models.cnn import CNNClassifier
from kindling.models.recurrent import GRUClassifier, LSTMClassifier, RNNClassifier
from kindling.models.transformer import TransformerClassifier

IMAGE_SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]
NETS = [CNNClassifier, RNNClassifier, LSTMClassifier, GRUClassifier, TransformerClassifier]


@pytest.mark.parametrize("image_shape", IMAGE_SHAPES)
@pytest.mark.parametrize("net_class", NETS)
def test_net_maps_images_to_logits(net_class: type[nn.Module], image_shape: tuple) -> None:
    net = net_class(image_shape=image_shape, num_classes=7)
    logits = net(torch.randn(5, *image_shape))
    assert logits.shape == (5, 7)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("net_class", NETS)
def test_net_gradients_reach_every_parameter(net_class: type[nn.Module]) -> None:
    net = net_class(image_shape=(1, 8, 8), num_classes=10)
    net(torch.randn(4, 1, 8, 8)).sum().backward()
    missing = [name for name, p in net.named_parameters() if p.grad is None]
    assert not missing


def test_images_are_read_one_row_per_step() -> None:
    images = torch.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    seq = as_steps(images)
    assert seq.shape == (2, 4, 15)
    # Step 1 of sample 0 is row 1 of every channel, channel after channel.
    assert torch.equal(seq[0, 1], torch.cat([images[0, c, 1] for c in range(3)]))


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("net_class", [RNNClassifier, LSTMClassifier, GRUClassifier])
def test_recurrent_options(net_class: type[nn.Module], bidirectional: bool) -> None:
    net = net_class(
        image_shape=(1, 8, 8),
        num_classes=3,
        hidden_size=16,
        num_layers=3,
        bidirectional=bidirectional,
    )
    assert net.rnn.num_layers == 3 and net.rnn.bidirectional == bidirectional
    assert net.head[-1].in_features == (32 if bidirectional else 16)
    assert net(torch.randn(2, 1, 8, 8)).shape == (2, 3)


def test_recurrent_classifier_uses_its_cell() -> None:
    assert isinstance(RNNClassifier((1, 8, 8), 10).rnn, nn.RNN)
    assert isinstance(LSTMClassifier((1, 8, 8), 10).rnn, nn.LSTM)
    assert isinstance(GRUClassifier((1, 8, 8), 10).rnn, nn.GRU)


def test_sequences_of_up_to_64_steps_are_read_step_by_step() -> None:
    assert [steps_per_patch(None, n) for n in (None, 7, 64, 65, 150, 427, 1460)] == [
        1, 1, 1, 2, 3, 7, 23,
    ]  # fmt: skip
    assert steps_per_patch(5, 7) == 5  # given: as given
    with pytest.raises(ValueError, match="at least 1"):
        steps_per_patch(0, 100)


@pytest.mark.parametrize("net_class", [RNNClassifier, LSTMClassifier, GRUClassifier,
                                       TransformerClassifier])  # fmt: skip
def test_one_step_a_patch_is_the_net_without_patches(net_class: type[nn.Module]) -> None:
    """Patches of one step (a short set's default, or patch_length=1 on a long one) are the net
    as it was before them: the same parameters drawn in the same order, the same logits."""
    steps, lengths = torch.randn(3, 60, 2), torch.tensor([60, 41, 3])
    # The Transformer's positions are the longest it reads: every one of its nets is given 60.
    transformer = net_class is TransformerClassifier
    longest = {"max_length": 60} if transformer else {}
    key = "max_length" if transformer else "longest_sequence"
    nets = []
    for options in (longest, {key: 60}, {key: 600, "patch_length": 1}):
        torch.manual_seed(0)
        nets.append(net_class(None, 4, num_features=2, **{**options, **longest}).eval())
    before = nets[0].state_dict()
    for net in nets[1:]:
        assert net.stem is None
        assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
        assert before.keys() == net.state_dict().keys()
        torch.testing.assert_close(net(steps, lengths), nets[0](steps, lengths), rtol=0, atol=0)


def test_a_stem_shortens_the_lengths_and_reads_no_padding() -> None:
    """Patches of 4 steps: lengths 10, 7 and 1 become 3, 2 and 1 patches; a sequence gives the
    same patches alone as in a batch padded (with noise) past its end, and 0 past its last."""
    torch.manual_seed(0)
    stem = ConvStem(features=2, width=8, patch=4)
    stem(torch.randn(3, 10, 2), torch.tensor([10, 7, 1]))  # batch norm: some running statistics
    stem.eval()
    batch = torch.randn(3, 10, 2)
    patched, lengths = stem(batch, torch.tensor([10, 7, 1]))
    assert patched.shape == (3, 3, 8) and lengths.tolist() == [3, 2, 1]
    for i, length in enumerate([10, 7, 1]):
        alone, (patches,) = stem(batch[i : i + 1, :length], torch.tensor([length]))
        torch.testing.assert_close(patched[i, :patches], alone[0], rtol=0, atol=1e-6)
        assert patched[i, patches:].abs().sum() == 0
    # Without lengths every step is real: the batch as one of full lengths.
    torch.testing.assert_close(stem(batch, None)[0], stem(batch, torch.tensor([10] * 3))[0])


def test_cnn_depth_and_width_follow_channels() -> None:
    net = CNNClassifier(image_shape=(3, 32, 32), num_classes=10, channels=[8, 16, 32])
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [8, 8, 16, 16, 32, 32]
    assert convs[0].in_channels == 3
    assert sum(isinstance(m, nn.BatchNorm2d) for m in net.modules()) == 6


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_transformer_pooling(pooling: str) -> None:
    net = TransformerClassifier(
        (1, 8, 8), 10, d_model=32, num_layers=1, num_heads=4, pooling=pooling
    )
    assert (net.cls_token is not None) == (pooling == "cls")
    assert net.pos_embedding.shape[1] == 8 + (pooling == "cls")
    assert net(torch.randn(3, 1, 8, 8)).shape == (3, 10)


def test_transformer_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="pooling"):
        TransformerClassifier((1, 8, 8), 10, pooling="max")
    with pytest.raises(ValueError, match="divisible"):
        TransformerClassifier((1, 8, 8), 10, d_model=30, num_heads=4)


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_matches_a_plain_softmax(causal: bool) -> None:
    torch.manual_seed(0)
    attn = SelfAttention(d_model=16, num_heads=2, causal=causal).eval()
    x = torch.randn(2, 5, 16)
    q, k, v = attn.qkv(x).view(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-1, -2) / 8**0.5
    if causal:
        scores = scores.masked_fill(torch.ones(5, 5).triu(1).bool(), float("-inf"))
    expected = attn.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(attn(x), expected)
