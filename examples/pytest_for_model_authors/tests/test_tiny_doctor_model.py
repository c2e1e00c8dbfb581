"""What a model author's test suite asks vLLM about their model (copy this folder).

    pytest tests/ --vllm-doctor-model path/to/checkpoint [--vllm-doctor-device cuda]

The `vllm_doctor` fixture comes with vllm-doctor (a pytest11 plugin): nothing to import.
Every assertion runs vLLM for real (in a child process, once per model and options for the
whole session) and fails with a message that says what differs, where, and the fix.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
# The model's Hugging Face implementation, the reference the vLLM port must match
HF_REFERENCE = f"{HERE / 'reference' / 'modeling_tiny_doctor_hf.py'}:TinyDoctorHFForCausalLM"
PROMPTS = ["hello world my name is", "the doctor is in and the world is"]


def test_static_checks_pass(vllm_doctor):
    vllm_doctor.assert_checks_pass(fail_on="error")


def test_checkpoint_fills_every_parameter(vllm_doctor):
    vllm_doctor.assert_weights_cover()


def test_kv_cache_holds_a_full_length_request(vllm_doctor):
    vllm_doctor.assert_kv_cache_fits(max_model_len=512)


def test_every_tensor_on_its_workers_device(vllm_doctor):
    vllm_doctor.assert_on_device()  # reuses the engine run above


def test_matches_the_hf_reference(vllm_doctor):
    vllm_doctor.assert_logprobs_close(
        reference="hf", hf_class=HF_REFERENCE, prompts=PROMPTS, max_tokens=8, top_k=5, dtype="float32"
    )


def test_matches_on_raw_token_ids(vllm_doctor):
    # other prompts, same engine options: the session's running engine answers (no new start)
    vllm_doctor.assert_logprobs_close(hf_class=HF_REFERENCE, prompts=[[7, 8, 9, 10, 11, 12, 13, 14]], max_tokens=4)
