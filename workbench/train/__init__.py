"""Training, export and conversion of the reference MoE shipped in ``data/models``.

Run ``python -m workbench.train --help``. Layout, in the order data flows:

- ``corpus.py``      site-packages Python source -> train / val / held-out (whole packages)
- ``tokenizer.py``   byte-level BPE (vocab 4096) and corpus encoding
- ``sets.py``        eval sets and prompt workloads (JSONL), cut on token boundaries
- ``configs.py``     model shapes; Hugging Face <-> mlx-lm config keys (``normalize_config``)
- ``torch_train.py`` the torch training loop (bf16 + fp32 master weights, resumable), bf16
                     evaluation and the compact int8 export (GPU machine)
- ``pipeline.py``    ``device-run``: everything above in one command on the GPU machine
- ``convert.py``     export -> quantized mlx-lm dirs (``ref-moe``, ``ref-draft``) here
- ``evaluate.py``    mlx measurements: held-out loss, routing stats, draft acceptance

Only ``torch_train.py`` and ``pipeline.device_run`` need the ``train`` extra (torch,
transformers >= 5, tokenizers, safetensors), and only on the GPU machine; converting and
measuring here needs mlx and mlx-lm (which bring tokenizers and safetensors).
"""
