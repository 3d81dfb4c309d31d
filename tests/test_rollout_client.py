"""SGLang client against two real `orchestrax serve` processes on loopback: multi-turn
token-in/token-out episodes keep going when one server is SIGKILLed mid-batch."""

import asyncio

import pytest
from loopback import check_token_episode, free_port, start_tiny_server, token_episode

from orchestrax.rollout.sampler import GenerateRequest
from orchestrax.rollout.sglang_client import (SamplerUnavailable, SGLangClient,
                                              SGLangClientConfig)


@pytest.mark.slow
def test_episodes_survive_a_server_killed_mid_batch():
    async def main():
        ports = [free_port(), free_port()]
        procs = await asyncio.gather(*(start_tiny_server(p) for p in ports))
        try:
            cfg = SGLangClientConfig(urls=tuple(f"http://127.0.0.1:{p}" for p in ports),
                                     health_interval_s=0.2, retry_backoff_s=0.01)
            async with SGLangClient(cfg) as client:
                tasks = [asyncio.create_task(token_episode(client, i, 3, max_new_tokens=12))
                         for i in range(16)]
                victim = client.servers[0]
                while victim.outstanding == 0:  # kill while requests are in flight there
                    await asyncio.sleep(0.001)
                procs[0].kill()
                out = await asyncio.gather(*tasks)
                stats = dict(client.stats)
                healthy = [s.healthy for s in client.servers]
                # With every server gone the request fails with a clear error, not a hang.
                procs[1].kill()
                await procs[1].wait()
                with pytest.raises(SamplerUnavailable):
                    await client.generate([GenerateRequest(input_ids=(1, 2, 3))])
            return out, stats, healthy
        finally:
            for p in procs:
                if p.returncode is None:
                    p.kill()
                await p.wait()

    out, stats, healthy = asyncio.run(main())
    assert len(out) == 16 and stats["retries"] >= 1 and stats["failures"] == 0
    assert healthy == [False, True]
    for ids, mask, results in out:
        check_token_episode(ids, mask, results, 3)
        assert all(r.weight_version == "default" for r in results)
