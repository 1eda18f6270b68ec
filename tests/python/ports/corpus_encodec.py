"""The corpus's speech pair: facebookresearch/encodec's EnCodec (the reference, materialised from its mirror) against
transformers' `modeling_encodec.py` copied into `encodec/vendored/` (the port), and the porting bugs patched into the
port one at a time (see docs/benchmarks.md, "Independent speech implementation: EnCodec").

A module of its own (`corpus.py` adds the pair and its bugs to the corpus): the 16 pinned files of the package and
six bugs would take `corpus.py` past the house limit of 900 lines.
"""

from __future__ import annotations

from ports.corpus_types import Bug, Pair, transformers_conversion
from ports.sources import Source, SourceFile

ENCODEC_PAIR = Pair(
    name="encodec",
    folder="encodec",
    port_file="vendored/modeling_encodec.py",
    reference_module="transformers.models.encodec.modeling_encodec",
    # the reference's convolutions (SConv1d, SConvTranspose1d: padding and trimming), where most of its forward is
    reference_file="encodec/modules/conv.py",
    # NOTE: the root's forward (model.py) reaches the residual quantizer (quantization/vq.py, core_vq.py) through
    # `encode` methods, no module call: only their line values show what it computed
    reference_follow=("encodec/model.py", "encodec/quantization/vq.py", "encodec/quantization/core_vq.py"),
    maps=(),
    sources=(
        Source(
            repo="facebookresearch/encodec",
            commit="0e2d0aed29362c8e8f52494baf3e6f99056b214f",
            license="LICENSE",
            files=(
                SourceFile(
                    "encodec/__init__.py",
                    "encodec/__init__.py",
                    "d4f128d445945e121a4d6d885554b1b4d58c88b941feae6d0e33807264f8619e",
                ),
                SourceFile(
                    "encodec/binary.py",
                    "encodec/binary.py",
                    "2ee80a45b46f27807ca72f64ed95109424cf87edca348e0c60fc02256a7ada70",
                ),
                SourceFile(
                    "encodec/compress.py",
                    "encodec/compress.py",
                    "ac12406ec0e0d92314c460e7c4957a9eb9f58e55e853588ad1d41bfce135c7a2",
                ),
                SourceFile(
                    "encodec/distrib.py",
                    "encodec/distrib.py",
                    "9c133a161202c5f4987315cb6821f33b0c8c4dce2e0eb01a1cdca0de3ec9d71b",
                ),
                SourceFile(
                    "encodec/model.py",
                    "encodec/model.py",
                    "edb61be57f97127fe3423c03796f9f6b2f53c808dc3939dd4db3b54d5aa7d51f",
                ),
                SourceFile(
                    "encodec/utils.py",
                    "encodec/utils.py",
                    "043ea1b8f3f087149fdd16f8b1b8c1514615f2f36fe44b12fec542af49d56243",
                ),
                SourceFile(
                    "encodec/modules/__init__.py",
                    "encodec/modules/__init__.py",
                    "df464b0516af77ae3f5ca79442e09d0f83592d6081e084f122a866581e84b0a8",
                ),
                SourceFile(
                    "encodec/modules/conv.py",
                    "encodec/modules/conv.py",
                    "29b5f8aee80973577d8cb30ea62a4ab84502f7b9ad42af113ea24f4da9a9f8d0",
                ),
                SourceFile(
                    "encodec/modules/lstm.py",
                    "encodec/modules/lstm.py",
                    "53d0511f2eb17f2a3e7dbf0f3b969e05a9392aa0f986a3ea918840da58aaffc4",
                ),
                SourceFile(
                    "encodec/modules/norm.py",
                    "encodec/modules/norm.py",
                    "23d5727c362bfcd43ee8ba2972531b6b63991a974c11a9156b179134ce2c87d3",
                ),
                SourceFile(
                    "encodec/modules/seanet.py",
                    "encodec/modules/seanet.py",
                    "3b5f4568f610506b1e443829e30929191096f78bd64ae5e68f419d63e0f15fdf",
                ),
                SourceFile(
                    "encodec/modules/transformer.py",
                    "encodec/modules/transformer.py",
                    "2f15cafae83dd40c84c576c75e9a4b6f75f0e7ef101fe12cd65f661da944b83d",
                ),
                SourceFile(
                    "encodec/quantization/__init__.py",
                    "encodec/quantization/__init__.py",
                    "34c806bc1cafc8b835926b6f6450bee769f95eb467cf1c19b4427e9dd7e55bbc",
                ),
                SourceFile(
                    "encodec/quantization/ac.py",
                    "encodec/quantization/ac.py",
                    "7b9be56fd1ab9d2cd20567c1fde9514e86135bbc4a0891b99f1682282c47a957",
                ),
                SourceFile(
                    "encodec/quantization/core_vq.py",
                    "encodec/quantization/core_vq.py",
                    "2f9c006decc8953543fc3cecea365014842cf4a9771cae3c980b9f07e6abc186",
                ),
                SourceFile(
                    "encodec/quantization/vq.py",
                    "encodec/quantization/vq.py",
                    "d45227a508fa30a88f77b7a7d8f23dae7da7afeba194bdf6d8458cec3c86610e",
                ),
            ),
        ),
        transformers_conversion(
            "encodec/convert_encodec_checkpoint_to_pytorch.py",
            "af6c5a6726d49393e4b8c22162a39531dd5b4b15eedf47d3fc94d70a94e159f7",
        ),
    ),
)

ENCODEC_BUGS: tuple[Bug, ...] = (
    Bug(
        name="zero_padding",
        pair="encodec",
        kind="padding mode",
        module="encoder.layers.0",
        old="hidden_states = self._pad1d(hidden_states, (self.padding_total, extra_padding), mode=self.pad_mode)",
        new='hidden_states = self._pad1d(hidden_states, (self.padding_total, extra_padding), mode="constant")',
        why="the causal convolutions padded on the left with zeros where EnCodec reflects the signal (pad_mode "
        "'reflect'): shows first in the encoder's first convolution",
    ),
    Bug(
        name="first_dilation",
        pair="encodec",
        kind="dilation",
        module="encoder.layers.1.block.1",
        old="model += [EncodecResnetBlock(config, current_scale, [config.dilation_growth_rate**j, 1])]",
        new="model += [EncodecResnetBlock(config, current_scale, [config.dilation_growth_rate, 1])]",
        why="the encoder's residual blocks built with the dilation base itself (2) where SEANet dilates the j-th "
        "block by base ** j (1 for the only block): a construction setting passed down two __init__s",
    ),
    Bug(
        name="lstm_skip_dropped",
        pair="encodec",
        kind="missing residual",
        module="encoder.layers.13",
        old="hidden_states = self.lstm(hidden_states)[0] + hidden_states",
        new="hidden_states = self.lstm(hidden_states)[0]",
        why="the skip connection around the LSTM dropped (SLSTM adds its input back): the encoder's 14th layer",
    ),
    Bug(
        name="causal_trim_centred",
        pair="encodec",
        kind="transposed-convolution trim",
        module="decoder.layers.3",
        old="            padding_right = math.ceil(padding_total * self.trim_right_ratio)\n",
        new="            padding_right = padding_total // 2\n",
        why="the causal transposed convolutions trimmed on both sides (the non-causal rule) where EnCodec's causal "
        "decoder trims all of the padding on the right (trim_right_ratio 1): the waveform shifts; the decoder's "
        "first upsampling layer",
    ),
    Bug(
        name="final_activation_tanh",
        pair="encodec",
        kind="activation",
        module="decoder.layers.14",
        old="        # Add final layers\n        model += [nn.ELU()]",
        new="        # Add final layers\n        model += [nn.Tanh()]",
        truth_at="model += [nn.Tanh()]",
        why="the decoder's last activation a Tanh (SEANet's optional final_activation, misplaced) where EnCodec "
        "applies ELU before its last convolution",
    ),
    Bug(
        name="residual_not_carried",
        pair="encodec",
        kind="residual quantization",
        module="",
        old="            residual = residual - quantized\n",
        new="            residual = embeddings - quantized\n",
        why="each codebook after the second quantizes the encoder output minus the previous codebook's vector, not "
        "the running residual; the quantizer's encode is a method the root's forward calls (no module call), so "
        "the root is where a diff can see it",
    ),
)
