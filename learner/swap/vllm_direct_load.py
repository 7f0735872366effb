"""A faster way for our CPU weight-transfer engine to load a full set of weights into a
running vLLM model: vLLM's layerwise reload without its round trip through the meta device.

vLLM-CPU repacks each linear layer's weight for its GEMM kernel and drops the weight
(``dispatch_cpu_unquantized_gemm``). To load new weights, vLLM's layerwise reload
(``model_loader/reload``) therefore puts every layer back in its loading layout on the meta
device, materializes fresh tensors, buffers and counts every loader call, and processes a
layer (repacks it) once all of it has arrived. Here the loading-layout tensors of the
layers whose weights were dropped or changed are made once and kept ("staging"), each
update loads into them and into the parameters still live (norms, embeddings) with the
model's own ``load_weights``, and each quantizable layer is then processed as the layerwise
reload processes it. The kernels come out as a reload from disk makes them; every swap is
checked exactly by the weight check all the same.

Used only where every such layer is understood (``DirectLoad.plan`` returns None
otherwise, and the engine keeps vLLM's layerwise reload). Imports torch and vLLM only: it
runs inside vLLM's worker.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class DirectLoad:
    """The staging tensors of one model, and the layers each update processes."""

    def __init__(
        self,
        layers: list[torch.nn.Module],
        staging: list[tuple[torch.nn.Module, str, torch.nn.Parameter]],
    ) -> None:
        self.layers = layers
        self.staging = staging
        # each staged layer's own parameter, while its staging tensor stands in
        self._replaced: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []

    @classmethod
    def plan(cls, model: torch.nn.Module) -> DirectLoad | None:
        """None where loading could need more than repacking: a layer whose quantization
        method is not one that only repacks, an attention layer or a model with processing
        of its own after loading, a dropped weight of a layer without a method; and a model
        served with LoRA (``--enable-lora``), whose wrapped layers vLLM's loader ties and
        names in ways only its layerwise reload handles."""
        from vllm.lora.layers import BaseLayerWithLoRA
        from vllm.model_executor.layers.attention import is_deferred_attention_layer
        from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
        from vllm.model_executor.model_loader.reload.layerwise import (
            LAYERWISE_INFO,
            _get_original_loader,
        )
        from vllm.model_executor.model_loader.reload.meta import (
            SKIP_TENSORS,
            materialize_meta_tensor,
        )
        from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

        if hasattr(model, "process_weights_after_loading"):
            return None
        if any(isinstance(module, BaseLayerWithLoRA) for module in model.modules()):
            return None
        layers: list[torch.nn.Module] = []
        staging: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []
        for layer in model.modules():
            info = LAYERWISE_INFO.get(layer)
            params = info.restore_metadata[0] if info is not None else {}
            method = getattr(layer, "quant_method", None)
            if not params:
                continue
            if is_deferred_attention_layer(layer):
                return None
            if not isinstance(method, QuantizeMethodBase):
                if method is not None:
                    return None
            elif type(method).__name__ not in REPACK_ONLY:
                return None
            else:
                layers.append(layer)
            for name, meta in params.items():
                if name in SKIP_TENSORS:
                    continue
                live = layer._parameters.get(name)
                if live is not None and live.shape == meta.shape and live.dtype == meta.dtype:
                    continue  # loaded in place
                if method is None:
                    return None  # dropped by something we do not process again
                shadow = materialize_meta_tensor(restore_layer_refs(meta, layer))
                # a layerwise reload (one from disk) leaves its buffering loader on the
                # recorded tensors: ours must copy
                shadow.weight_loader = _get_original_loader(shadow)
                staging.append((layer, name, shadow))
        return cls(layers, staging) if layers else None

    def load(self, model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load into the staging tensors (registered on their layers meanwhile) and into the
        live parameters. On failure the layers get their own parameters back, so that
        vLLM's reload from disk, which the learner then runs, finds them as it left them."""
        self._replaced = [(layer, name, layer._parameters[name]) for layer, name, _ in self.staging]
        for layer, name, shadow in self.staging:
            layer._parameters[name] = shadow
        try:
            model.load_weights(weights)
        except BaseException:
            self._unstage()
            raise

    def finish(self) -> None:
        """Process each layer as vLLM does after loading: the CPU kernels repack (and drop
        the staging tensor from the layer). On failure, as for ``load``."""
        try:
            for layer in self.layers:
                if hasattr(layer, "_already_called_process_weights_after_loading"):
                    delattr(layer, "_already_called_process_weights_after_loading")
                layer.quant_method.process_weights_after_loading(layer)
                if hasattr(layer, "update_param_tp_status"):
                    layer.update_param_tp_status()
        except BaseException:
            self._unstage()
            raise
        self._replaced = []

    def _unstage(self) -> None:
        """Put back each layer's own parameter where a staging tensor still stands in."""
        shadows = {id(shadow) for _, _, shadow in self.staging}
        for layer, name, own in self._replaced:
            if id(layer._parameters.get(name)) in shadows:
                layer._parameters[name] = own
        self._replaced = []


# the unquantized methods: on CPU their processing repacks the weight for the GEMM kernel
# (and may drop it), nothing else
REPACK_ONLY = {"UnquantizedLinearMethod", "UnquantizedEmbeddingMethod"}
