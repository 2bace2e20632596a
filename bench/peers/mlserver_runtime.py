"""An MLServer runtime (MLModel) that calls the benchmark's jax function."""

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse

import common


class JaxRuntime(MLModel):
    async def load(self) -> bool:
        max_batch = int((self.settings.parameters.extra or {}).get("max_batch_size", 8))
        self._run = common.load_model(max_batch)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        if len(payload.inputs) != 1 or payload.inputs[0].name != common.INPUT_NAME:
            raise MLServerError(f"expected one input named {common.INPUT_NAME!r}", 400)
        x = NumpyCodec.decode_input(payload.inputs[0])
        if x.dtype != np.float32 or x.ndim != 2 or x.shape[1:] != common.INPUT_SHAPE:
            raise MLServerError(f"expected FP32 [n,16], got {x.dtype} {list(x.shape)}", 400)
        out = NumpyCodec.encode_output(common.OUTPUT_NAME, self._run(x))
        # No {"content_type": "np"} parameter on the output: Triton's HTTP
        # client (perf_analyzer) takes an output "parameters" object to carry
        # "binary_data_size" and fails without it.
        out.parameters = None
        return InferenceResponse(model_name=self.name, model_version=self.version,
                                 outputs=[out])
