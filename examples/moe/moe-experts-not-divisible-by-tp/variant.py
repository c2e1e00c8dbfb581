"""Three experts, served with tensor_parallel_size=2: the expert count is not divisible by the
tensor-parallel size. vLLM's FusedMoE does not divide experts over TP ranks (each rank holds a
slice of every expert's intermediate dimension), so this runs; only expert parallelism splits
experts (2 + 1 here), and on CPU that crashes for an even split as well (docs/moe.md).
`vllm-doctor check --tensor-parallel-size 2` says so (VD305, info): nothing fails."""

EXPECT_CODE = "VD305"  # an info at --tensor-parallel-size 2: the experts are sliced, not divided
ENGINE_MODE = "inprocess"  # the engine core; the two TP workers are processes of their own
DESCRIPTION = "num_local_experts=3 served with tensor_parallel_size=2"
# what the author passes to LLM(...) on top of the harness's small engine settings
ENGINE_KWARGS = {"tensor_parallel_size": 2}
# vLLM's CPU workers bind to NUMA nodes; with one node, two workers need explicit core lists
# (else: "Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers")
ENGINE_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
NUM_EXPERTS = 3


def apply(ctx):
    old = ctx.config["num_local_experts"]
    ctx.config["num_local_experts"] = NUM_EXPERTS
    for name in list(ctx.weights):
        if ".block_sparse_moe.experts." in name and int(name.split(".experts.")[1].split(".")[0]) >= NUM_EXPERTS:
            del ctx.weights[name]
        elif name.endswith(".block_sparse_moe.gate.weight"):
            assert ctx.weights[name].shape[0] == old
            ctx.weights[name] = ctx.weights[name][:NUM_EXPERTS].contiguous()
