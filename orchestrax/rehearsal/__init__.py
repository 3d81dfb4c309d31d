"""`orchestrax rehearse`: the recipe in miniature, every process real on loopback. It sits above
both `train` and `eval` because it runs both (the trainer processes, then `orchestrax eval` of
the export) and checks the eval's prompts before anything starts."""
