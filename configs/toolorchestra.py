"""The ToolOrchestra recipe, one function per scale, all built from the same parts below:
scale changes model size, mesh, batch shapes and endpoints, never the tools, data or algorithm.

    config()            one 8-GPU node: 4 SGLang servers on 4 GPUs, the trainer FSDP on the others
    config_one_h200()   one H200, embedded sampler
    config_multinode()  several nodes: trainer processes under SLURM, an SGLang fleet behind a router
    config_tpu()        a TPU pod slice, embedded sampler, checkpoints on gs://
    config_rehearsal()  the whole recipe at CPU size on loopback (2 JAX processes x 4 CPU devices)

Where a value comes from: "paper" = the ToolOrchestra paper (seeds/toolorchestra.txt), "script" =
the official training script of the code release, "ours" = chosen here (the paper is silent).
Edit ENDPOINTS to move an LLM tool (e.g. GPT-5 to a local server): one line per model.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

from orchestrax import models
from orchestrax.data.instances import InstanceConfig
from orchestrax.envs.mixture import MixConfig, MixSource
from orchestrax.envs.qa import QAConfig
from orchestrax.envs.tau2 import Tau2Config
from orchestrax.envs.toolscale import ToolScaleConfig
from orchestrax.parallel import MeshConfig
from orchestrax.rl import GRPOConfig, OptimizerConfig
from orchestrax.tools.catalog import CatalogConfig
from orchestrax.tools.chat_client import ChatEndpoint
from orchestrax.tools.llm_tool import LLMToolConfig
from orchestrax.tools.randomize import RandomizeConfig
from orchestrax.tools.sandbox import SandboxConfig
from orchestrax.tools.search_index import SearchIndexConfig
from orchestrax.tools.web_search import WebSearchConfig
from orchestrax.train.train_config import RolloutConfig, TrainConfig

# ../shared/data of this checkout (tau2 domains, QA sets, the Wikipedia corpus); edit for yours.
DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
MODELS = pathlib.Path("/models")                 # HF checkpoints: Qwen3-8B, Qwen3-4B
# JSONL trajectories for the SFT warm start (orchestrax/data/sft.py gives the format).
SFT_DATA = ("data/sft/toolorchestra_sft.jsonl",)

# --- where each LLM is served: model -> (OpenAI-compatible base URL, served name, key env) -----
ENDPOINTS: dict[str, tuple[str, str, str | None]] = {
    "gpt-5": ("https://api.openai.com/v1", "gpt-5", "OPENAI_API_KEY"),
    "gpt-5-mini": ("https://api.openai.com/v1", "gpt-5-mini", "OPENAI_API_KEY"),
    "llama-3.3-70b": ("http://127.0.0.1:31001/v1", "meta-llama/Llama-3.3-70B-Instruct", None),
    "qwen3-32b": ("http://127.0.0.1:31002/v1", "Qwen/Qwen3-32B", None),
    "qwen2.5-math-72b": ("http://127.0.0.1:31003/v1", "Qwen/Qwen2.5-Math-72B-Instruct", None),
    "qwen2.5-coder-32b": ("http://127.0.0.1:31004/v1", "Qwen/Qwen2.5-Coder-32B-Instruct", None),
}
# The LLM tools (paper: specialised math/coder models and generalists): tool name, role, model.
# Each model name is also its key in the pricing sheets (orchestrax/tools/pricing).
LLM_TOOLS = (("gpt5", "generalist", "gpt-5"), ("gpt5_mini", "generalist", "gpt-5-mini"),
             ("llama_70b", "generalist", "llama-3.3-70b"), ("qwen3_32b", "generalist", "qwen3-32b"),
             ("math_72b", "math", "qwen2.5-math-72b"), ("coder_32b", "coder", "qwen2.5-coder-32b"))
# The simulated user of tau2 episodes (paper: an LLM plays the customer).
USER = ("http://127.0.0.1:31000/v1", "Qwen3-32B")


# --- the parts ----------------------------------------------------------------------------------
def tools(endpoints: dict[str, tuple[str, str, str | None]] = ENDPOINTS, *,
          search_backend: str = "dense", search_titles: tuple[str, ...] | None = None,
          web: bool = True, sandbox: SandboxConfig = SandboxConfig(),
          llm_max_tokens: int = 1024, llm_temperature: float = 0.0, llm_seed: int | None = None,
          clock: str = "measured") -> CatalogConfig:
    """Paper's tool set: code sandbox, local search (FAISS over an embedder; "bm25" where no
    embedder), web search (Tavily; left out without its key), the LLM tools (at most
    `llm_max_tokens` a reply, sampled at `llm_temperature` with `llm_seed`); priced by the
    training sheet `train_list` (instances then draw from every training sheet). `clock`: the
    sandbox and local search are charged their measured seconds (the recipe) or their nominal
    ones (the rehearsal: a redone step then reproduces the killed run's rewards under any load)."""
    llms = []
    for name, role, model in LLM_TOOLS:
        url, served, key = endpoints[model]
        llms.append(LLMToolConfig(name=name, role=role, price_model=model, sandbox=sandbox,
                                  chat=ChatEndpoint(base_url=url, model=served, api_key_env=key,
                                                    max_tokens=llm_max_tokens,
                                                    temperature=llm_temperature, seed=llm_seed)))
    return CatalogConfig(
        python=sandbox,
        search=SearchIndexConfig(corpus_path=str(DATA / "corpus" / "wiki_summaries_en.json"),
                                 backend=search_backend, titles=search_titles),
        web=WebSearchConfig() if web else None,
        llms=tuple(llms), sheet="train_list", clock=clock)


def instances() -> InstanceConfig:
    """Paper: every training instance gets a random tool subset and a random training pricing
    sheet, and a preference vector P (with its instruction) drawn from Pairs_train."""
    return InstanceConfig(preferences=True, randomize=RandomizeConfig(min_tools=1))


def mixture(user: tuple[str, str] | None = USER, *, tau2_domains=("retail", "airline", "telecom"),
            qa_sets=("musique_500", "bamboogle_125", "aime_2024_2025"),
            toolscale: tuple[tuple[str, str], ...] = (),
            tool_share: float = 0.5) -> MixConfig:
    """Task sources and weights: `tool_share` of the tasks from the tool-use
    domains (tau2 here; `toolscale` = ((domain folder, tasks file), ...) adds ToolScale domains
    with synthesised tasks), the rest QA as the reasoning part (paper: GeneralThought-430K, not
    available here; FRAMES stays out for evaluation). Each group splits its share evenly (ours)."""
    endpoint = ChatEndpoint(base_url=user[0], model=user[1]) if user else None
    domains = [(f"tau2_{d}", Tau2Config(domain=str(DATA / "tau2" / d), user=endpoint))
               for d in tau2_domains]
    domains += [(f"toolscale_{pathlib.Path(folder).name}",
                 ToolScaleConfig(domain=folder, tasks=tasks)) for folder, tasks in toolscale]
    qa = [(f"qa_{name}", QAConfig(path=str(DATA / "qa" / f"{name}.jsonl"))) for name in qa_sets]
    qa_share = 1 - tool_share if domains else 1.0
    out = [MixSource(name=n, weight=tool_share / len(domains), env=e) for n, e in domains]
    out += [MixSource(name=n, weight=qa_share / len(qa), env=e) for n, e in qa]
    return MixConfig(sources=tuple(out))


def grpo(*, num_minibatches: int = 4, num_microbatches: int = 8,
         logprob_chunk: int | None = 1024) -> GRPOConfig:
    """The official hyper-parameters; the split into micro-batches is a memory choice only."""
    return GRPOConfig(
        clip_low=0.2, clip_high=0.28,  # script: asymmetric clip (DAPO's clip-higher)
        dual_clip=10.0,                # script: dual-clip c = 10 on negative advantages
        kl_coef=1e-4, kl="k3",         # script: KL to the reference 1e-4 (paper omits the KL)
        min_group_std=0.1,             # paper: homogeneity filter, std(R) < 0.1 dropped
        adv_clip=3.0,                  # script
        agg="token-mean", ppo_epochs=1,  # script
        num_minibatches=num_minibatches, num_microbatches=num_microbatches, tis_cap=2.0,
        logprob_chunk=logprob_chunk)


def optim() -> OptimizerConfig:
    return OptimizerConfig(lr=1e-6,    # paper and script
                           warmup_steps=10, schedule="constant", total_steps=10_000,
                           weight_decay=0.01, max_grad_norm=1.0)  # script


def rollout(**sizes) -> RolloutConfig:
    base = dict(
        group_size=8,                  # paper: G = 8 trajectories per task
        tasks_per_step=16,             # script: 16 tasks per step (16 x 8 = 128 episodes)
        max_turns=50,                  # paper: 50 turns
        context_tokens=24_000,         # script: 24k-token episodes
        max_new_tokens=8192, temperature=1.0, enable_thinking=True, max_in_flight=1024)
    return RolloutConfig(**(base | sizes))


def recipe(**changes) -> TrainConfig:
    """Every scale's common config: Qwen3-8B, SFT warm start then GRPO on the mixture."""
    base = dict(
        name="toolorchestra", hf_path=str(MODELS / "Qwen3-8B"), tokenizer=str(MODELS / "Qwen3-8B"),
        dtype="bfloat16", remat="full",  # fp32 master weights, bf16 compute
        mesh=MeshConfig(axes=(("data", 1), ("fsdp", -1), ("tensor", 1))),
        grpo=grpo(), optim=optim(),
        sft_optim=OptimizerConfig(lr=1e-5, warmup_steps=20, schedule="cosine", total_steps=500,
                                  weight_decay=0.0),  # ours: the warm start only fixes the format
        rollout=rollout(backend="sglang", server_urls=_urls(30000, 4)),
        env=mixture(),
        tools=tools(), instances=instances(),
        sft_data=SFT_DATA, sft_steps=500, sft_batch=64,
        steps=500, out_dir="runs/toolorchestra", checkpoint_every=10, eval_every=25)
    return TrainConfig(**(base | changes))


def _urls(first_port: int, n: int, host: str = "127.0.0.1") -> tuple[str, ...]:
    return tuple(f"http://{host}:{first_port + i}" for i in range(n))


# --- the scales ---------------------------------------------------------------------------------
def config() -> TrainConfig:
    """One 8-GPU node: SGLang servers on 4 GPUs at ports 30000-30003, the trainer FSDP over the
    other 4 (launch/gpu_single_node.sh)."""
    return recipe()


def config_one_h200() -> TrainConfig:
    """One H200 (141 GB), embedded sampler, Qwen3-8B at the recipe's shapes: fp32 master
    weights, bf16 Adam moments (stochastic rounding, rl/optim.py), gradients accumulated layer by
    layer into one fp32 buffer (remat "full"), one 24k row a micro-step. bench/gpu_compile.py
    compiles that step for the H200 well inside the 133 GiB usable at
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 (bench/RESULTS.md)."""
    c = recipe(name="toolorchestra-h200", out_dir="runs/toolorchestra-h200",
               mesh=MeshConfig(axes=(("data", 1), ("fsdp", 1), ("tensor", 1))),
               grpo=grpo(num_microbatches=32),
               optim=dataclasses.replace(optim(), mu_dtype="bfloat16", nu_dtype="bfloat16"))
    c = c.replace(sft_optim=dataclasses.replace(c.sft_optim, mu_dtype="bfloat16",
                                                nu_dtype="bfloat16"))   # fp32 Adam: 144 GiB
    # The sampler, the continuous engine (its decode step writes the slot cache in place), runs
    # next to the train state and the reference (76 GiB): 8 slots of 24k (bench/gpu_compile.py).
    return c.replace(rollout=dataclasses.replace(c.rollout, backend="embedded", server_urls=(),
                                                 sampler_max_batch=8))


def config_multinode(hosts: tuple[str, ...] = ("rollout-0", "rollout-1"),
                     servers_per_node: int = 8) -> TrainConfig:
    """Several nodes: one trainer process per node (launch/slurm_multinode.sbatch), each sending
    its share of episodes to an SGLang fleet of `servers_per_node` servers on each rollout node
    in `hosts` (launch/sglang_fleet.sh); the weight-sync directory must be on a filesystem the
    servers see."""
    urls = tuple(u for host in hosts for u in _urls(30000, servers_per_node, host=host))
    c = recipe(name="toolorchestra-multinode", out_dir="/shared/runs/toolorchestra")
    return c.replace(rollout=dataclasses.replace(
        c.rollout, server_urls=urls, weight_sync_dir="/shared/orchestrax_weights"))


def config_tpu() -> TrainConfig:
    """A TPU pod slice (e.g. v5p-32: 4 hosts x 4 chips): FSDP over all chips, embedded sampler
    (no SGLang on TPU). Each process samples its own 128 / 4 = 32 episodes a step on its own 4
    chips (`sampler_copy`), the cache's 8 kv heads 2 a chip: 32 slots x 24,000 positions x 36
    layers x 2 heads x 128 x 2 (K, V) x 2 bytes = 26.4 GiB a chip (arithmetic, not compiled: no
    TPU target here), one wave a step. It was 128 slots a process: 105 GiB a chip, which the
    engine refuses when built."""
    c = recipe(name="toolorchestra-tpu", hf_path="/mnt/models/Qwen3-8B",
               tokenizer="/mnt/models/Qwen3-8B", out_dir="gs://YOUR_BUCKET/orchestrax/qwen3-8b")
    return c.replace(rollout=dataclasses.replace(c.rollout, backend="embedded", server_urls=(),
                                                 sampler_max_batch=32))


# The rehearsal's loopback ports, from a base (ORCHESTRAX_REHEARSAL_PORT, default 30500) so
# that two rehearsals on one machine can differ: two rollout servers, one per trainer process
# (each process syncs weights to its own), and two `orchestrax serve --tiny` experts on a box
# of two cores: the generalist LLMs and the user simulator on one, the specialists on the other.
def rehearsal_ports() -> dict[str, int]:
    base = int(os.environ.get("ORCHESTRAX_REHEARSAL_PORT", "30500"))
    return {"rollout-0": base + 1, "rollout-1": base + 2, "generalists": base + 10,
            "specialists": base + 11}


def config_rehearsal(out_dir: str = "runs/rehearsal") -> TrainConfig:
    """The recipe at CPU size, run by `orchestrax rehearse`: a tiny random Qwen3 as 2 processes x
    4 CPU devices, each process's rollouts on its own loopback server, every LLM tool and the
    tau2 user a tiny local server, BM25 over 200 passages of the Wikipedia corpus, two QA sets,
    a warm start on tool-call conversations through the real tools (each question with four
    tools in turn, so the called name follows the offered tool, not the question), two GRPO
    steps. Each instance offers one tool (a size: the whole catalog's schemas are ~2,000
    tiny-tokenizer tokens; with one tool a conversation is ~700 and three fill a row, so the
    warm start sees three times the conversations a step and its policy opens its turns with
    `<tool_call>`)."""
    ports = rehearsal_ports()
    expert = {role: f"http://127.0.0.1:{ports[role]}/v1" for role in ("generalists", "specialists")}
    experts = {model: (expert["specialists" if model.startswith("qwen2.5") else "generalists"],
                       "default", None) for model in ENDPOINTS}
    user = (expert["generalists"], "default")
    titles = tuple(sorted(_corpus_titles())[:200])
    return recipe(
        name="toolorchestra-rehearsal", hf_path=None, tokenizer="tiny", dtype="float32",
        remat="none",
        model=models.tiny_config(vocab_size=512, hidden_size=64, intermediate_size=128,
                                 num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32),
        grpo=grpo(num_minibatches=2, num_microbatches=1, logprob_chunk=None),
        sft_optim=OptimizerConfig(lr=1e-2, warmup_steps=2, schedule="constant", total_steps=160,
                                  weight_decay=0.0),
        instances=dataclasses.replace(instances(), randomize=dataclasses.replace(
            instances().randomize, max_tools=1)),
        rollout=rollout(backend="sglang",
                        server_urls=tuple(f"http://127.0.0.1:{ports[f'rollout-{i}']}"
                                          for i in range(2)),
                        # 16 instances a step, so the tools they offer span the catalog's
                        # kinds (basic, specialist, generalist) and the step calls each kind
                        # (8 offered no specialist and only the two generalists the policy
                        # names worst); context: the longest train prompt (one tool, the
                        # longest Pairs_train instruction) is 2,119 tokens, which the trainer
                        # checks; the held-out eval offers the whole catalog (2,524 tokens)
                        # and runs at rehearse.EVAL_CONTEXT_TOKENS.
                        group_size=2, tasks_per_step=16, max_turns=2, context_tokens=2304,
                        max_new_tokens=64, enable_thinking=False, max_in_flight=16,
                        weight_sync_dir=f"{out_dir}/weights"),
        # No tau2 domain: a retail prompt with its tools is 10.6k tiny-tokenizer tokens, which
        # made the warm start alone take over 20 minutes on two shared cores.
        env=mixture(user, tau2_domains=(), qa_sets=("bamboogle_125", "aime_2024_2025")),
        # The experts are random tiny models with tied embeddings: greedy decoding copies the
        # prompt's last token ("\n" after the assistant header), a reply that strips to nothing.
        # Sampled they write random words; the seed keeps a redone step's observations equal.
        tools=tools(experts, search_backend="bm25", search_titles=titles, web=False,
                    llm_max_tokens=16, llm_temperature=1.0, llm_seed=0, clock="nominal"),
        # Checkpoints every 80 SFT steps and after the last of 2 GRPO steps: a kill after
        # step 1 resumes from the warm start and redoes step 1, whose metrics the killed run
        # logged (a checkpoint costs ~10 s here). 160 SFT steps of 8 rows, ~3 conversations
        # a row (BUILD.md: what the policy's calls look like after them).
        sft_data=(f"{out_dir}/sft.jsonl",), sft_steps=160, sft_batch=8, steps=2,
        out_dir=out_dir, checkpoint_every=80, eval_every=0, eval_tasks=8)


def _corpus_titles() -> list[str]:
    import json
    return list(json.loads((DATA / "corpus" / "wiki_summaries_en.json").read_text()))
