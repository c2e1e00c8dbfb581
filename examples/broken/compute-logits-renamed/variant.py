"""compute_logits is renamed (get_logits)."""

EXPECT_CODE = "VD204"
ENGINE_MODE = "inprocess"
DESCRIPTION = "TinyDoctorForCausalLM has get_logits, no compute_logits"


def apply(ctx):
    ctx.edit(
        "model.py",
        "    def compute_logits(self, hidden_states",
        "    def get_logits(self, hidden_states",
    )
