"""Print fields of a train config for the launch scripts, exactly as the trainer will see them:
    python launch/config_value.py CONFIG[:function] FIELD [FIELD ...] [--set key=value ...]
Each FIELD (dotted, e.g. rollout.server_urls) prints on its own line; a tuple prints its items
space-separated."""

import sys

from orchestrax.train.overrides import apply_overrides, load_config


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    spec, rest = argv[0], argv[1:]
    fields, sets = [], []
    while rest:
        arg = rest.pop(0)
        if arg == "--set":
            sets.append(rest.pop(0))
        elif arg.startswith("--set="):
            sets.append(arg.removeprefix("--set="))
        else:
            fields.append(arg)
    cfg = apply_overrides(load_config(spec), sets)
    for field in fields:
        value = cfg
        for part in field.split("."):
            value = getattr(value, part)
        print(" ".join(map(str, value)) if isinstance(value, tuple) else value)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
