"""One answer to "what is this module" (vllm_doctor.compat.roles), on torch module trees.

vLLM's own layer classes and declarations (``get_mm_mapping``) are read in
tests/integration/test_roles_vllm.py, with vLLM's real classes; here the model's own classes
(which declare nothing), torch's layers and a Hugging Face-like reference model.
"""

from __future__ import annotations

from types import SimpleNamespace

from torch import nn

from vllm_doctor.compat import roles
from vllm_doctor.compat.perf import perf_anatomy
from vllm_doctor.engine.layers import select_modules


class LlamaAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(8, 8) for _ in range(4))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Linear(8, 16), nn.Linear(16, 8)


class Mixer(nn.Module):  # a state-space mixer of the model's own (its kind comes from its KV spec)
    def __init__(self) -> None:
        super().__init__()
        self.in_proj, self.out_proj = nn.Linear(8, 32), nn.Linear(32, 8)


class Layer(nn.Module):
    def __init__(self, state: bool) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(8)
        if state:
            self.mixer = Mixer()
        else:
            self.self_attn = LlamaAttention()
        self.ffn = FeedForward()


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(32, 8)
        self.layers = nn.ModuleList([Layer(state=False), Layer(state=True)])
        self.norm = nn.LayerNorm(8)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = Inner()
        self.lm_head = nn.Linear(8, 32)


def test_torch_layers_say_what_they_are_and_a_models_own_classes_are_read_by_name() -> None:
    assert roles.layer_class(nn.Linear(2, 2)) == roles.LayerClass("linear", False)
    assert roles.layer_class(nn.Embedding(4, 2)) == roles.LayerClass("embedding", False)
    assert roles.layer_class(nn.LayerNorm(2)) == roles.LayerClass("norm", False)
    assert roles.layer_class(LlamaAttention()) is None  # the model's own: declares nothing
    assert roles.module_kind("model.layers.0.self_attn", LlamaAttention()) == "attention"
    assert roles.module_kind("model.layers.0.ffn", FeedForward()) == "mlp"
    assert roles.module_kind("model.layers.0.input_layernorm", nn.LayerNorm(8)) == "norm"
    assert roles.module_kind("lm_head", nn.Linear(8, 32)) == "logits"  # a plain linear by its place
    assert roles.module_kind("model.layers.0.self_attn.q_proj", nn.Linear(8, 8)) is None  # its parent's


def test_every_module_under_a_kind_counts_as_the_topmost_kind_and_a_mixer_by_its_spec() -> None:
    """The per-layer profile times the topmost module of a kind; a projection's time is in it.
    A token mixer's holder takes the mixer's family (here: the second layer's state mixer)."""
    model = Model()
    kinds = roles.kinds_by_path(model, {"model.layers.1.mixer": "state"})
    assert kinds["model.layers.0.self_attn.q_proj"] == "attention"
    assert kinds["model.layers.0.ffn.w1"] == "mlp"
    assert kinds["model.layers.1.mixer"] == kinds["model.layers.1.mixer.in_proj"] == "state"
    assert kinds["model.embed_tokens"] == "embedding" and kinds["lm_head"] == "logits"
    assert "model.layers.0" not in kinds and "model" not in kinds  # no kind: timed as a layer / the model
    # the profiler selects the same kinds: one answer
    timed = {m.name: m.kind for m in select_modules(model, mixers={"model.layers.1.mixer": "state"})}
    for name, kind in timed.items():
        if kind not in ("layer", "model"):
            assert kinds[name] == kind, name


def test_the_lint_records_where_each_projection_is_counted() -> None:
    """VD601/VD602's measured cost reads the projection's role: the profile's kind, not its name
    (a state mixer's in_proj was counted as MLP by the old name rule)."""
    anatomy = perf_anatomy(Model(), SimpleNamespace(hidden_size=8), None, "test", {"model.layers.1.mixer": "state"})
    role = {p.name: p.role for p in anatomy.projections}
    assert role["model.layers.0.self_attn.v_proj"] == "attention"
    assert role["model.layers.1.mixer.in_proj"] == "state"
    assert role["model.layers.1.ffn.w2"] == "mlp"
    assert role["lm_head"] == "logits"


class VisionTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4)])
        self.merger = nn.Linear(4, 8)


class HfVlm(nn.Module):
    """A Hugging Face reference model's layout: parts named, nothing declared."""

    def __init__(self) -> None:
        super().__init__()
        self.vision_tower = VisionTower()
        self.multi_modal_projector = nn.Linear(4, 8)
        self.language_model = Model()


def test_a_reference_models_parts_by_name() -> None:
    parts = roles.named_parts(HfVlm())
    assert parts.encoder == ("vision_tower", "multi_modal_projector") and parts.source == "names"
    assert parts.pairs() == [(roles.VISION_TOWER, "vision_tower"), (roles.PROJECTOR, "multi_modal_projector")]
    assert roles.model_parts(HfVlm()) == roles.ModelParts()  # no vLLM model: not multimodal to vLLM


class PortVlm(HfVlm):
    """A port that tells vLLM it is multimodal and names its language model."""

    supports_multimodal = True

    def get_language_model(self) -> nn.Module:
        return self.language_model


def test_a_port_without_get_mm_mapping_is_read_beside_its_language_model() -> None:
    model = PortVlm()
    parts = roles.model_parts(model)
    assert parts.source == "get_language_model" and parts.language_model == "language_model"
    assert parts.towers == ("vision_tower",) and parts.connectors == ("multi_modal_projector",)
    assert roles.language_model(model) is model.language_model
    assert parts.part_of("vision_tower.blocks.0") == roles.VISION_TOWER
    assert parts.part_of("multi_modal_projector") == roles.PROJECTOR
    assert parts.part_of("language_model.model.layers.0") is None


class DeclaredVlm(PortVlm):
    """vLLM's declaration wins over names: a tower whose connector sits inside it (Qwen2.5-VL's
    ``visual.merger.``, the prefixes with their trailing dots as vLLM's models write them)."""

    def get_mm_mapping(self) -> SimpleNamespace:
        return SimpleNamespace(
            language_model=["language_model"],
            connector=["vision_tower.merger.", "multi_modal_projector"],
            tower_model=["vision_tower."],
        )


def test_get_mm_mapping_is_read_first_and_a_connector_inside_its_tower_is_not_named_twice() -> None:
    parts = roles.model_parts(DeclaredVlm())
    assert parts.source == "get_mm_mapping"
    assert parts.towers == ("vision_tower",)
    assert parts.connectors == ("vision_tower.merger", "multi_modal_projector")
    assert parts.encoder == ("vision_tower", "multi_modal_projector")
    assert parts.part_of("vision_tower.merger") == roles.PROJECTOR
    assert parts.part_of("vision_tower.blocks.0") == roles.VISION_TOWER


class StaleDeclaration(PortVlm):
    def get_mm_mapping(self) -> SimpleNamespace:
        return SimpleNamespace(language_model="lm", connector="proj.", tower_model="tower.")


def test_a_declaration_that_names_no_module_of_the_model_is_not_believed() -> None:
    assert roles.model_parts(StaleDeclaration()).source == "get_language_model"
