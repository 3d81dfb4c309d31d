"""Qwen3-8B on a TPU pod slice: the ToolOrchestra recipe's TPU scale (configs/toolorchestra.py),
checkpoints and metrics under gs://. Launch with launch/tpu_pod.sh. Loads from any working
directory."""

import pathlib
import runpy

config = runpy.run_path(str(pathlib.Path(__file__).with_name("toolorchestra.py")))["config_tpu"]
