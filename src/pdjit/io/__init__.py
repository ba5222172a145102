"""Reading and writing programs and parameters in PaddlePaddle's formats."""
from pdjit.io import checkpoint, reader
from pdjit.io.checkpoint import *  # noqa: F401,F403
from pdjit.io.inference_model import load_inference_model, save_inference_model
from pdjit.io.reader import *  # noqa: F401,F403
from pdjit.io.tensor_stream import (
                                    load_combined_params,
                                    persistable_names,
                                    read_tensor,
                                    save_combined_params,
                                    write_tensor,
)
from pdjit.io.variables import (
                                    is_parameter,
                                    is_persistable,
                                    load_params,
                                    load_persistables,
                                    load_vars,
                                    save_params,
                                    save_persistables,
                                    save_vars,
)

__all__ = ["load_combined_params", "persistable_names", "read_tensor", "save_combined_params",
           "write_tensor", "is_persistable", "is_parameter", "load_persistables", "load_vars",
           "save_persistables", "save_vars", "save_params", "load_params", "save_inference_model",
           "load_inference_model"]
__all__ += checkpoint.__all__ + reader.__all__
