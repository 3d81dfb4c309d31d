"""Export a training run's checkpoint as a Hugging Face directory that transformers loads.

    python tools/export_hf.py RUN_DIR OUT_DIR [--step N] [--dtype bfloat16] [--overwrite]

The operator's entry point to `orchestrax.train.export` (also `python -m
orchestrax.train.export`), which says what is written and how.
"""

from orchestrax.train.export import ExportError, export, main

__all__ = ["ExportError", "export", "main"]

if __name__ == "__main__":
    main()
