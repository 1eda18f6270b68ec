"""`modeltrace trace encodec/modules/conv.py --recipe recipe_reference.py`: facebookresearch/encodec's EnCodec as
published (materialised from its mirror, see ports/corpus.py), a causal 24 kHz-like model shrunk (4 base filters,
ratios 4-4-2-2, a 16-wide latent, 4 codebooks of 1024 entries), seeded, at a fixed bandwidth of 15 kbps (all 4
codebooks).

The hyper-parameters below are the ones `recipe_port.py` builds transformers' `EncodecModel` from.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from corpus_common import SEED, make_trained_like
from vision_common import importing_without

# NOTE: `encodec/utils.py` imports torchaudio at its top for audio files (`convert_audio`, `save_audio`), which
# the model never calls: it is stood in for while the package is imported (never installed here).
with importing_without(("torchaudio",)):
    from encodec.model import EncodecModel
    from encodec.modules import SEANetDecoder, SEANetEncoder
    from encodec.quantization import ResidualVectorQuantizer

SAMPLE_RATE = 24_000
FILTERS = 4
DIMENSION = 16
RATIOS = [4, 4, 2, 2]  # the decoder's upsampling order; the encoder downsamples in reverse
# as the published models: `_get_model`'s rule for n_q assumes 10 bits a code, transformers' reads log2(bins)
BINS = 1024
# n_q = 1000 * largest bandwidth // (frame rate * 10 bits) = 15000 // 3750 = 4 (`_get_model`, and transformers'
# `EncodecConfig.num_quantizers`)
TARGET_BANDWIDTHS = [3.75, 7.5, 15.0]
BANDWIDTH = 15.0  # 10 bits a code at 375 frames a second: 3.75 kbps a codebook, all 4 codebooks
AUDIO_SAMPLES = 2048  # 32 frames of 64 samples
CODEBOOK_NOISE = 0.5  # of each residual dimension's spread over the frames


def build_reference() -> nn.Module:
    """EnCodec as `EncodecModel._get_model` builds the 24 kHz model (causal, weight norm, reflect padding), small."""
    torch.manual_seed(SEED)
    encoder = SEANetEncoder(channels=1, dimension=DIMENSION, n_filters=FILTERS, ratios=RATIOS, causal=True)
    decoder = SEANetDecoder(channels=1, dimension=DIMENSION, n_filters=FILTERS, ratios=RATIOS, causal=True)
    frame_rate = -(-SAMPLE_RATE // encoder.hop_length)
    n_q = int(1000 * TARGET_BANDWIDTHS[-1] // (frame_rate * 10))
    quantizer = ResidualVectorQuantizer(dimension=DIMENSION, n_q=n_q, bins=BINS)
    model = EncodecModel(encoder, decoder, quantizer, TARGET_BANDWIDTHS, SAMPLE_RATE, channels=1)
    model.set_target_bandwidth(BANDWIDTH)
    _keep_the_signal(model)
    make_trained_like(model)
    _place_codebooks(model)
    return model.eval()


def _keep_the_signal(model: nn.Module) -> None:
    """Convolution weights drawn as He's normal initialisation (transformers' `_init_weights` for EnCodec's convs).

    NOTE: PyTorch's default draw shrinks each convolution's output to about a third of its input's spread: through
    the 18 convolutions of the encoder the audio would fade under the biases, and every frame would encode alike. In
    the weight norm's terms: `weight_v` drawn He-normal, `weight_g` its norm (so that the weight is `weight_v`).
    """
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)) and hasattr(module, "weight_v"):
                fan_in = (
                    module.weight_v[0].numel()
                    if isinstance(module, nn.Conv1d)
                    else module.weight_v.shape[0] * module.weight_v.shape[2]
                )
                module.weight_v.copy_(torch.randn(module.weight_v.shape, generator=generator) * (2.0 / fan_in) ** 0.5)
                module.weight_g.copy_(torch.linalg.vector_norm(module.weight_v, dim=(1, 2), keepdim=True))


def _place_codebooks(model: nn.Module) -> None:
    """Codebooks near the frames they quantize, as the k-means initialisation on a first batch places them.

    NOTE: the published codebooks start as zeros (k-means runs on the first training batch). Random vectors far
    from the encoder's frames would give every frame the same code, so that no difference before the quantizer
    could reach the decoder: each codebook here holds the frames of the test audio's residual, each plus seeded
    noise of the residual's own spread, so that a frame's code follows its values.
    """
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        residual = model.encoder(audio()).transpose(1, 2).reshape(-1, DIMENSION)  # [frames, dimension]
        for layer in model.quantizer.vq.layers:
            chosen = torch.randint(0, residual.shape[0], (BINS,), generator=generator)
            noise = torch.randn(BINS, DIMENSION, generator=generator) * residual.std(dim=0)
            embed = residual[chosen] + CODEBOOK_NOISE * noise
            layer._codebook.embed.copy_(embed)
            layer._codebook.embed_avg.copy_(embed)
            residual = residual - embed[torch.cdist(residual, embed).argmin(dim=1)]


def audio(seed: int = SEED) -> torch.Tensor:
    """A seeded `[1, 1, AUDIO_SAMPLES]` waveform, the same on both sides of the pair."""
    return 0.1 * torch.randn(1, 1, AUDIO_SAMPLES, generator=torch.Generator().manual_seed(seed))


def build_model() -> nn.Module:
    return build_reference()


def build_inputs(model: nn.Module) -> tuple[torch.Tensor]:
    return (audio(),)
