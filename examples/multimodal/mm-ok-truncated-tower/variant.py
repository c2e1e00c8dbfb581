"""A working variant: the vision tower built up to vision_feature_layer, as vLLM's LLaVA builds it."""

EXPECT_CODE = None  # works: no weights finding (issue 32, step 3)
ENGINE_MODE = "inprocess"
DESCRIPTION = (
    "config declares 2 vision layers and vision_feature_layer=-2: the class builds 1 and its vision "
    "tower's load_weights skips the checkpoint's layer 1, as vLLM's CLIP/SigLIP towers do under LLaVA"
)


def apply(ctx):
    ctx.config["vision_num_hidden_layers"] = 2
    ctx.config["vision_feature_layer"] = -2
    layer0 = "vision_tower.encoder.layers.0."
    for name, tensor in list(ctx.weights.items()):
        if name.startswith(layer0):
            ctx.weights["vision_tower.encoder.layers.1." + name[len(layer0):]] = tensor.clone()
    # LLaVA's rule: a negative feature layer counts from the end, the layers after it are not built
    ctx.edit(
        "model.py",
        "for _ in range(config.vision_num_hidden_layers)\n",
        "for _ in range(config.vision_num_hidden_layers + config.vision_feature_layer + 1)\n",
    )
    ctx.edit(
        "model.py",
        "    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:\n"
        "        x = self.embeddings(pixel_values)\n",
        "    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:\n"
        "        # as vLLM's CLIPVisionTransformer.load_weights: drop the layers that were not built\n"
        "        params = dict(self.named_parameters())\n"
        "        loaded: set[str] = set()\n"
        "        for name, tensor in weights:\n"
        '            if name.startswith("encoder.layers.") and int(name.split(".")[2]) >= len(self.encoder.layers):\n'
        "                continue\n"
        "            default_weight_loader(params[name], tensor)\n"
        "            loaded.add(name)\n"
        "        return loaded\n"
        "\n"
        "    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:\n"
        "        x = self.embeddings(pixel_values)\n",
    )
