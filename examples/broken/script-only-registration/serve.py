"""The author's launch script: `python serve.py MODEL_DIR`.

It registers the model right before starting the engine. vLLM starts the engine core and
the worker in spawned processes; they re-import this file as `__mp_main__`, so the block
below never runs there and `TinyDoctorForCausalLM` is unknown where the model is built.
"""

import sys

from vllm import LLM, SamplingParams

if __name__ == "__main__":
    from tiny_doctor_script_only_registration import register

    register()  # AutoConfig.register + ModelRegistry.register_model, in this process only
    llm = LLM(
        model=sys.argv[1],
        enforce_eager=True,
        kv_cache_memory_bytes=64 * 2**20,
        max_model_len=256,
    )
    outputs = llm.generate(["hello world"], SamplingParams(max_tokens=8, temperature=0))
    print(outputs[0].outputs[0].text)
