"""Gemma 3n's audio tower written by transformers itself, for the multimodal Gemma 3n rules:
tests/fixtures/hf_parts/gemma3n_audio/.

transformers builds `Gemma3nForConditionalGeneration` and `Gemma3nModel` only with timm (their
vision tower is a `TimmWrapperModel`: make_hf_fixtures.py writes their folders with an
interpreter that has timm); the audio tower, `Gemma3nAudioEncoder`, builds without it, and
its encodings are compared here on audio (the whole classes' folders are fed none). This script saves a tiny random one
(torch's initial values moved by a seeded normal perturbation, as make_hf_fixtures.py does)
under the names the multimodal classes give it (`model.audio_tower.`), its config as
`audio_config.json`, and beside it `oracle.safetensors`: fixed log-mel inputs (the second
example padded from frame 30 on) and transformers' outputs (the encodings and their mask).

Pinned as make_hf_fixtures.py (transformers==5.24.0, torch==2.13.0+cpu); run with an
interpreter that has them: `python tests/helpers/make_gemma3n_audio_fixture.py`. Seeded, one
thread: re-running it writes the same bytes.
"""

from __future__ import annotations

import json
import os
import sys

from make_hf_fixtures import PINNED, SCALE, SEED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fixtures", "hf_parts", "gemma3n_audio")
# two conformer blocks over 16 mel bins; sub-sampled by 4 in time, then reduced by 2
AUDIO = {"vocab_size": 8, "vocab_offset": 72, "input_feat_size": 16, "hidden_size": 16,
         "rms_norm_eps": 1e-6, "gradient_clipping": 1e10, "conf_attention_chunk_size": 4,
         "conf_attention_context_left": 5, "conf_attention_context_right": 0,
         "conf_attention_logit_cap": 50.0, "conf_num_attention_heads": 2,
         "conf_num_hidden_layers": 2, "conf_conv_kernel_size": 3, "conf_reduction_factor": 2,
         "conf_residual_weight": 0.5, "sscp_conv_channel_size": [8, 4],
         "sscp_conv_group_norm_eps": 1e-3, "sscp_conv_kernel_size": [[3, 3], [3, 3]],
         "sscp_conv_stride_size": [[2, 2], [2, 2]]}
FRAMES, PADDED_FROM = 40, 30


def write(out: str = OUT) -> None:
    import numpy as np
    import torch
    from safetensors.numpy import save_file
    from transformers import Gemma3nAudioConfig
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nAudioEncoder

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    model = Gemma3nAudioEncoder(Gemma3nAudioConfig(**AUDIO)).eval()
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for _, parameter in sorted(model.named_parameters()):
            parameter.add_(torch.randn(parameter.shape, generator=generator) * SCALE)
    mel = torch.randn(2, FRAMES, AUDIO["input_feat_size"], generator=generator)
    mask = torch.zeros(2, FRAMES, dtype=torch.bool)
    mask[1, PADDED_FROM:] = True  # True: padding, as transformers' audio_mel_mask
    with torch.no_grad():
        result = model(mel, mask)
    os.makedirs(out, exist_ok=True)
    save_file({"model.audio_tower." + k: v.contiguous().numpy()
               for k, v in sorted(model.state_dict().items())},
              os.path.join(out, "model.safetensors"))
    oracle = {"input_features": mel, "input_features_mask": mask,
              "audio_encodings": result.last_hidden_state, "audio_mask": result.audio_mel_mask}
    # (the mask is a strided view: its own bytes, not its buffer's)
    save_file({k: np.ascontiguousarray(v.numpy()) for k, v in oracle.items()},
              os.path.join(out, "oracle.safetensors"),
              metadata={"oracle": json.dumps({  # one key: its order is fixed
                  "transformers": PINNED["transformers"], "class": "Gemma3nAudioEncoder",
                  "run": "float32"}, sort_keys=True)})
    with open(os.path.join(out, "audio_config.json"), "w", encoding="utf-8") as f:
        json.dump(AUDIO, f, indent=1, sort_keys=True)
        f.write("\n")
    assert np.asarray(result.last_hidden_state).shape == (2, FRAMES // 8, AUDIO["hidden_size"])


def check_versions() -> None:
    import torch
    import transformers

    found = {"transformers": transformers.__version__, "torch": torch.__version__}
    if found != PINNED:
        sys.exit(f"make_gemma3n_audio_fixture.py is pinned to {PINNED}; found {found}.")


if __name__ == "__main__":
    check_versions()
    write(sys.argv[1] if len(sys.argv) > 1 else OUT)
    print(f"wrote {OUT}")
