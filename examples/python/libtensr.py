"""libtensr.py - Python binding of libtensr (ctypes + numpy), one file.

    import libtensr as tsr
    print(tsr.version(), [(d.name, d.free, d.total) for d in tsr.devices()])
    with tsr.Backend(n_threads=2) as be:
        with be.context() as ctx:
            a = ctx.input(np.ones((3, 4), np.float32))   # shape (m, k) -> ne = [k, m]
            b = ctx.input(np.ones((2, 4), np.float32))   # shape (n, k) -> ne = [k, n]
            c = ctx.mul_mat(a, b)                        # ne = [m, n]
            ctx.compute(c)
            print(c.numpy())                             # shape (n, m) == b @ a.T

    with tsr.Model("model.gguf", n_threads=4) as m:  # the model layer
        for piece in m.generate("The capital of France is", 16, temperature=0):
            print(piece, end="", flush=True)
        with m.session(n_ctx=512, n_seq=2) as s:
            logits = s.decode(m.tokenize("Hello"), seq=0)  # shape (1, m.n_vocab)

Conventions: numpy shapes are row-major, libtensr's ne[] innermost first, so
an array of shape (d3, d2, d1, d0) is a tensor with ne = [d0, d1, d2, d3].
Every failure raises tsr.Error, which carries the status (a number and its
name) and the library's message (tsr_last_error or the context's error).
Bad Python input (a wrong dtype, too many dimensions, a closed context or
backend) raises tsr.Error too and never reaches the C library.

The library is found through LIBTENSR_PATH, then ctypes.util.find_library,
then the build tree this file lives in; a library of another major version is
refused.
"""
import codecs
import contextlib
import ctypes
import ctypes.util
import os
import weakref

import numpy as np

# The library version this binding was written for: a library with another
# major version has another ABI and is refused.
WRITTEN_FOR = (0, 2, 0)

__all__ = ["Error", "version", "version_info", "devices", "Device", "Buffer", "Backend",
           "Context", "Tensor", "KVCache", "GGUF", "GGUFWriter", "TensorInfo", "type_name",
           "type_by_name", "type_info", "quantize", "dequantize", "set_log_level",
           "get_log_level", "set_log_callback", "backends_available", "last_error",
           "clear_error", "fp32_to_fp16", "fp16_to_fp32", "fp32_to_bf16", "bf16_to_fp32",
           "Model", "Session", "Sampler"]

# ---------------------------------------------------------------------------
# Loading the library
# ---------------------------------------------------------------------------


def _candidates():
    env = os.environ.get("LIBTENSR_PATH")
    if env:
        yield env
    found = ctypes.util.find_library("tensr")
    if found:
        yield found
    here = os.path.dirname(os.path.abspath(__file__))
    for up in ("..", os.path.join("..", "..")):
        for name in ("libtensr.so", "libtensr.so.0", "libtensr.dylib"):
            yield os.path.normpath(os.path.join(here, up, ".libs", name))


def _load():
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError("libtensr: shared library not found; set LIBTENSR_PATH. Tried: "
                      + "; ".join(tried))



_lib, _lib_path = _load()

_P = ctypes.c_void_p
_S = ctypes.c_size_t
_I64 = ctypes.c_int64
_STR = ctypes.c_char_p
_I = ctypes.c_int
_F = ctypes.c_float
_U32 = ctypes.c_uint32
_U64 = ctypes.c_uint64
_I32 = ctypes.c_int32
_PTR = ctypes.POINTER
_PI64 = _PTR(_I64)
_STATUS = ctypes.c_int

_LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, _P, _S, _P)
_PROGRESS_FN = ctypes.CFUNCTYPE(ctypes.c_int, _U64, _U64, _P)


class _BackendParams(ctypes.Structure):
    _fields_ = [("size", _S), ("devices", _P), ("n_threads", _I), ("flash_attn", _I),
                ("attn_max_batch", _S), ("batch_invariant", _I)]


class _BuftOverride(ctypes.Structure):
    _fields_ = [("pattern", _STR), ("buft", _P)]


class _LoadParams(ctypes.Structure):
    _fields_ = [("size", _S), ("n_gpu_layers", _I), ("main_gpu", _I),
                ("tensor_split", _PTR(ctypes.c_float)),
                ("overrides", _PTR(_BuftOverride)), ("use_mmap", _I),
                ("n_io_threads", _I), ("progress", _PROGRESS_FN), ("progress_user", _P),
                ("verify", _I), ("plan_only", _I), ("vocab_only", _I)]


class _KVCacheParams(ctypes.Structure):
    _fields_ = [("size", _S), ("n_layers", _I), ("n_ctx", _I64), ("n_head_kv", _I),
                ("head_dim_k", _I), ("head_dim_v", _I), ("type_k", _I), ("type_v", _I),
                ("n_seq", _I), ("n_batch_max", _I64)]


class _SessionParams(ctypes.Structure):
    _fields_ = [("size", _S), ("n_ctx", _I64), ("n_batch", _I64), ("n_ubatch", _I64),
                ("n_seq_max", _I32), ("n_outputs_max", _I64), ("type_k", _I), ("type_v", _I)]


class _SamplerParams(ctypes.Structure):
    _fields_ = [("size", _S), ("temp", _F), ("top_k", _I32), ("top_p", _F), ("min_p", _F),
                ("repeat_penalty", _F), ("repeat_last_n", _I32), ("seed", _U64)]


_FIT_MAX = 16


class _FitParams(ctypes.Structure):
    _fields_ = [("size", _S), ("margins", _PTR(_S)), ("n_margins", _S), ("gpu_margin", _S),
                ("host_margin", _S), ("n_ctx_min", _I64), ("prefer", _I),
                ("keep_n_gpu_layers", _I), ("keep_n_ctx", _I)]


class _FitResult(ctypes.Structure):
    _fields_ = [("size", _S), ("n_gpu_layers", _I), ("n_cpu_moe", _I), ("n_ctx", _I64),
                ("tensor_split", ctypes.c_float * _FIT_MAX), ("overrides", _PTR(_BuftOverride)),
                ("n_devices", _S), ("planned", _S * _FIT_MAX), ("available", _S * _FIT_MAX),
                ("n_layers", _I), ("n_candidates", _I), ("seconds", ctypes.c_double)]


class _ChatMessage(ctypes.Structure):
    _fields_ = [("role", _STR), ("content", _STR)]


# name: (restype, argtypes). Every function the binding calls is declared;
# a function the loaded library lacks raises tsr.Error when called. Functions
# that share a prototype are declared together by the loops below the table.
_T = _P  # tensor handle
_SIGS = {
    "tsr_version": (ctypes.c_uint, []),
    "tsr_version_string": (_STR, []),
    "tsr_status_string": (_STR, [_STATUS]),
    "tsr_last_error": (_STR, []),
    "tsr_clear_error": (None, []),
    "tsr_log_get_level": (_I, []),
    "tsr_log_set": (None, [_LOG_FN, _P]),
    "tsr_log_set_level": (None, [_I]),
    "tsr_type_name": (_STR, [_I]),
    "tsr_type_by_name": (_STATUS, [_STR, _PTR(_I)]),
    "tsr_row_size": (_S, [_I, _I64]),
    "tsr_quantize": (_STATUS, [_I, _P, _P, _I64]),
    "tsr_dequantize": (_STATUS, [_I, _P, _P, _I64]),
    "tsr_device_count": (_S, []),
    "tsr_device_get": (_P, [_S]),
    "tsr_device_by_name": (_P, [_STR]),
    "tsr_device_kind": (_I, [_P]),
    "tsr_device_index_in_model": (_I, [_P]),
    "tsr_device_memory": (_STATUS, [_P, _PTR(_S), _PTR(_S)]),
    "tsr_buffer_alloc": (_STATUS, [_P, _S, _PTR(_P)]),
    "tsr_buffer_free": (None, [_P]),
    "tsr_type_block_size": (_I64, [_I]),
    "tsr_type_block_bytes": (_S, [_I]),
    "tsr_type_is_quantized": (_I, [_I]),
    "tsr_fp32_to_fp16": (ctypes.c_uint16, [_F]),
    "tsr_fp16_to_fp32": (_F, [ctypes.c_uint16]),
    "tsr_fp32_to_bf16": (ctypes.c_uint16, [_F]),
    "tsr_bf16_to_fp32": (_F, [ctypes.c_uint16]),
    "tsr_free": (None, [_P]),
    "tsr_backends_available": (_STR, []),
    "tsr_buffer_type_by_name": (_P, [_STR]),
    "tsr_buft_overrides_parse": (_STATUS, [_STR, _PTR(_PTR(_BuftOverride))]),
    "tsr_buft_overrides_free": (None, [_PTR(_BuftOverride)]),
    "tsr_backend_params_init": (None, [_PTR(_BackendParams), _S]),
    "tsr_backend_new": (_STATUS, [_PTR(_BackendParams), _PTR(_P)]),
    "tsr_backend_free": (None, [_P]),
    "tsr_backend_device": (_P, [_P, _S]),
    "tsr_backend_n_threads": (_I, [_P]),
    "tsr_backend_flash_attn": (_I, [_P]),
    "tsr_load_params_init": (None, [_PTR(_LoadParams), _S]),
    "tsr_backend_load_gguf": (_STATUS, [_P, _STR, _PTR(_LoadParams)]),
    "tsr_backend_declare_weight": (_STATUS, [_P, _STR, _I, _I, _PI64]),
    "tsr_backend_place_weights": (_STATUS, [_P, _PTR(_LoadParams)]),
    "tsr_backend_weight": (_T, [_P, _STR]),
    "tsr_backend_weight_at": (_T, [_P, _S]),
    "tsr_backend_n_layers": (_I, [_P]),
    "tsr_backend_weight_on": (_T, [_P, _STR, _P]),
    "tsr_backend_log_plan": (None, [_P]),
    "tsr_backend_layer_buffer_type": (_P, [_P, _I]),
    "tsr_backend_memory_plan": (_STATUS, [_P, _S, _PTR(_S), _PTR(_S), _PTR(_S)]),
    "tsr_context_new": (_P, [_P]),
    "tsr_context_close": (None, [_P]),
    "tsr_context_error": (_STR, [_P]),
    "tsr_context_status": (_STATUS, [_P]),
    "tsr_input": (_T, [_P, _I, _I, _PI64, _P]),
    "tsr_new_tensor": (_T, [_P, _P, _I, _I, _PI64]),
    "tsr_empty": (_T, [_P, _I, _I, _PI64]),
    "tsr_set_name": (_T, [_T, _STR]),
    "tsr_tensor_name": (_STR, [_T]),
    "tsr_tensor_type": (_I, [_T]),
    "tsr_tensor_n_dims": (_I, [_T]),
    "tsr_tensor_ne": (_I64, [_T, _I]),
    "tsr_tensor_nb": (_S, [_T, _I]),
    "tsr_tensor_nelements": (_I64, [_T]),
    "tsr_tensor_is_contiguous": (_I, [_T]),
    "tsr_tensor_read": (_STATUS, [_T, _P, _S, _S]),
    "tsr_tensor_write": (_STATUS, [_T, _P, _S, _S]),
    "tsr_scale": (_T, [_P, _T, _F]),
    "tsr_set_rows": (_T, [_P, _T, _T, _T]),
    "tsr_rms_norm": (_T, [_P, _T, _F]),
    "tsr_norm": (_T, [_P, _T, _F]),
    "tsr_rope": (_T, [_P, _T, _T, _I, _I, _F, _F]),
    "tsr_rope_ext": (_T, [_P, _T, _T, _T, _I, _I, _I, _F, _F, _F, _F, _F, _F]),
    "tsr_softmax_ext": (_T, [_P, _T, _T, _F]),
    "tsr_concat": (_T, [_P, _T, _T, _I]),
    "tsr_cast": (_T, [_P, _T, _I]),
    "tsr_view_1d": (_T, [_P, _T, _I64, _S]),
    "tsr_view_2d": (_T, [_P, _T, _I64, _I64, _S, _S]),
    "tsr_view_3d": (_T, [_P, _T, _I64, _I64, _I64, _S, _S, _S]),
    "tsr_view_4d": (_T, [_P, _T, _I64, _I64, _I64, _I64, _S, _S, _S, _S]),
    "tsr_reshape": (_T, [_P, _T, _I, _PI64]),
    "tsr_permute": (_T, [_P, _T, _I, _I, _I, _I]),
    "tsr_flash_attn": (_T, [_P, _T, _T, _T, _T, _F]),
    "tsr_compute": (_STATUS, [_P, _PTR(_T), _S]),
    "tsr_reserve": (_STATUS, [_P, _PTR(_T), _S]),
    "tsr_measure": (_STATUS, [_P, _PTR(_T), _S, _PTR(_S)]),
    "tsr_kv_cache_params_init": (None, [_PTR(_KVCacheParams), _S]),
    "tsr_kv_cache_new": (_STATUS, [_P, _PTR(_KVCacheParams), _PTR(_P)]),
    "tsr_kv_cache_free": (None, [_P]),
    "tsr_kv_cache_begin": (_STATUS, [_P, _P, _I64, _PTR(_I32), _PTR(_I32)]),
    "tsr_kv_cache_begin_again": (_STATUS, [_P, _P, _I64, _PTR(_I32), _PTR(_I32)]),
    "tsr_kv_cache_clear": (None, [_P]),
    "tsr_kv_cache_remove": (_STATUS, [_P, _I, _I32, _I32]),
    "tsr_kv_cache_used": (_I64, [_P]),
    "tsr_kv_cache_n_ctx": (_I64, [_P]),
    "tsr_kv_cache_mask": (_T, [_P]),
    "tsr_kv_cache_begin_reserve": (_STATUS, [_P, _P, _I64]),
    "tsr_attention": (_T, [_P, _P, _I, _T, _T, _T, _F]),
    "tsr_attention_nocache": (_T, [_P, _T, _T, _T, _T, _F]),
    "tsr_gguf_open": (_STATUS, [_STR, _PTR(_P)]),
    "tsr_gguf_open_memory": (_STATUS, [_P, _S, _STR, _I, _PTR(_P)]),
    "tsr_gguf_data_offset": (_U64, [_P]),
    "tsr_gguf_path": (_STR, [_P]),
    "tsr_gguf_get_raw": (_STATUS, [_P, _I64, _PTR(_P), _PTR(_S)]),
    "tsr_gguf_close": (None, [_P]),
    "tsr_gguf_version": (_U32, [_P]),
    "tsr_gguf_n_tensors": (_I64, [_P]),
    "tsr_gguf_n_keys": (_I64, [_P]),
    "tsr_gguf_alignment": (_S, [_P]),
    "tsr_gguf_find_key": (_I64, [_P, _STR]),
    "tsr_gguf_key_name": (_STR, [_P, _I64]),
    "tsr_gguf_key_type": (_I, [_P, _I64]),
    "tsr_gguf_get_str": (_STATUS, [_P, _STR, _PTR(_P), _PTR(_S)]),
    "tsr_gguf_get_arr_info": (_STATUS, [_P, _STR, _PTR(_I), _PTR(_U64)]),
    "tsr_gguf_get_arr_data": (_STATUS, [_P, _STR, _PTR(_P)]),
    "tsr_gguf_get_arr_str": (_STATUS, [_P, _STR, _U64, _PTR(_P), _PTR(_S)]),
    "tsr_gguf_find_tensor": (_I64, [_P, _STR]),
    "tsr_gguf_tensor_name": (_STR, [_P, _I64]),
    "tsr_gguf_tensor_type": (_I, [_P, _I64]),
    "tsr_gguf_tensor_n_dims": (_I, [_P, _I64]),
    "tsr_gguf_tensor_ne": (_I64, [_P, _I64, _I]),
    "tsr_gguf_tensor_offset": (_U64, [_P, _I64]),
    "tsr_gguf_tensor_size": (_S, [_P, _I64]),
    "tsr_gguf_read_tensor": (_STATUS, [_P, _I64, _P, _S]),
    "tsr_gguf_writer_new": (_STATUS, [_PTR(_P)]),
    "tsr_gguf_writer_free": (None, [_P]),
    "tsr_gguf_writer_set_alignment": (_STATUS, [_P, _S]),
    "tsr_gguf_writer_set": (_STATUS, [_P, _STR, _I, _P]),
    "tsr_gguf_writer_set_str": (_STATUS, [_P, _STR, _STR]),
    "tsr_gguf_writer_set_arr": (_STATUS, [_P, _STR, _I, _P, _U64]),
    "tsr_gguf_writer_set_arr_str": (_STATUS, [_P, _STR, _PTR(_STR), _U64]),
    "tsr_gguf_writer_add_tensor": (_STATUS, [_P, _STR, _I, _I, _PI64, _P]),
    "tsr_gguf_writer_write_file": (_STATUS, [_P, _STR]),
    "tsr_gguf_writer_copy_keys": (_STATUS, [_P, _P]),
    "tsr_gguf_writer_write_memory": (_STATUS, [_P, _PTR(_P), _PTR(_S)]),
    "tsr_kv_cache_seq_pos_max": (_I32, [_P, _I]),
    # the model layer
    "tsr_model_load": (_STATUS, [_P, _STR, _PTR(_LoadParams), _PTR(_P)]),
    "tsr_model_free": (None, [_P]),
    "tsr_model_arch": (_STR, [_P]),
    "tsr_model_n_vocab": (_I32, [_P]),
    "tsr_model_n_ctx_train": (_I64, [_P]),
    "tsr_model_token_bos": (_I32, [_P]),
    "tsr_model_token_eos": (_I32, [_P]),
    "tsr_model_token_is_eog": (_I, [_P, _I32]),
    "tsr_model_tokenize": (_STATUS, [_P, _STR, _S, ctypes.c_uint, _PTR(_I32), _S, _PTR(_S)]),
    "tsr_model_token_piece": (_STATUS, [_P, _I32, _I, _P, _S, _PTR(_S)]),
    "tsr_model_detokenize": (_STATUS, [_P, _PTR(_I32), _S, _I, _P, _S, _PTR(_S)]),
    "tsr_model_chat_format": (_STATUS, [_P, _PTR(_ChatMessage), _S, _I, _P, _S, _PTR(_S)]),
    "tsr_fit_params_init": (None, [_PTR(_FitParams), _S]),
    "tsr_fit": (_STATUS, [_STR, _PTR(_BackendParams), _PTR(_LoadParams), _PTR(_SessionParams),
                          _PTR(_FitParams), _PTR(_FitResult)]),
    "tsr_fit_result_free": (None, [_PTR(_FitResult)]),
    "tsr_fit_result_flags": (_STATUS, [_PTR(_FitResult), _P, _S, _PTR(_S)]),
    "tsr_session_params_init": (None, [_PTR(_SessionParams), _S]),
    "tsr_session_new": (_STATUS, [_P, _PTR(_SessionParams), _PTR(_P)]),
    "tsr_session_free": (None, [_P]),
    "tsr_session_decode": (_STATUS, [_P, _S, _PTR(_I32), _PTR(_I32), _PTR(_I32),
                                     _PTR(ctypes.c_int8)]),
    "tsr_session_logits": (_P, [_P, _S]),
    "tsr_session_remove": (_STATUS, [_P, _I32, _I32, _I32]),
    "tsr_session_n_past": (_I32, [_P, _I32]),
    "tsr_session_n_ctx": (_I64, [_P]),
    "tsr_sampler_params_init": (None, [_PTR(_SamplerParams), _S]),
    "tsr_sampler_new": (_STATUS, [_P, _PTR(_SamplerParams), _PTR(_P)]),
    "tsr_sampler_free": (None, [_P]),
    "tsr_sampler_sample": (_I32, [_P, _P]),
    "tsr_sampler_reset": (None, [_P]),
    "tsr_sampler_accept": (_STATUS, [_P, _I32]),
}
# graph ops of one and of two tensors
for _name in ("softmax", "silu", "gelu", "argmax", "cont", "transpose", "sigmoid", "sum_rows"):
    _SIGS["tsr_" + _name] = (_T, [_P, _T])
for _name in ("add", "sub", "mul", "div", "mul_mat", "get_rows", "swiglu", "geglu", "cpy"):
    _SIGS["tsr_" + _name] = (_T, [_P, _T, _T])
_SIGS["tsr_mul_mat_id"] = (_T, [_P, _T, _T, _T])
_SIGS["tsr_top_k"] = (_T, [_P, _T, _I])
_SIGS["tsr_argsort"] = (_T, [_P, _T, _I])
# (restype, argtypes): functions of one handle
for _res, _arg, _names in (
        (_STR, _P, ("device_name", "device_description", "buffer_type_name")),
        (_P, _P, ("device_buffer_type", "device_host_buffer_type", "buffer_type_device",
                  "buffer_get_type", "tensor_buffer_type", "tensor_device")),
        (_S, _P, ("buffer_size", "backend_n_devices", "backend_attn_max_batch",
                  "backend_n_splits", "backend_n_copies", "backend_n_weights",
                  "tensor_nbytes"))):
    for _name in _names:
        _SIGS["tsr_" + _name] = (_res, [_arg])
# the typed GGUF getters: (handle, key, out value)
for _name, _out in (("u32", _U32), ("i32", _I32), ("f32", ctypes.c_float), ("i64", _I64),
                    ("u64", _U64), ("f64", ctypes.c_double), ("bool", _I)):
    _SIGS["tsr_gguf_get_" + _name] = (_STATUS, [_P, _STR, _PTR(_out)])


class _Lib:
    """The declared functions; missing ones raise tsr.Error when called."""


C = _Lib()
for _name, (_res, _args) in _SIGS.items():
    try:
        _fn = getattr(_lib, _name)
    except AttributeError:
        def _fn(*_a, _n=_name):
            raise Error(TSR_E_UNSUPPORTED, "%s: not exported by %s" % (_n, _lib_path))
    else:
        _fn.restype = _res
        _fn.argtypes = _args
    setattr(C, _name[4:], _fn)

# ---------------------------------------------------------------------------
# Constants (values are forever: see libtensr.h)
# ---------------------------------------------------------------------------
(TSR_OK, TSR_E_INVALID, TSR_E_NOMEM, TSR_E_DEVICE_NOMEM, TSR_E_IO, TSR_E_MALFORMED,
 TSR_E_UNSUPPORTED, TSR_E_NOT_FOUND, TSR_E_DEVICE, TSR_E_CANCELLED, TSR_E_FULL, TSR_E_TYPE,
 TSR_E_STATE, TSR_E_RANGE) = range(14)
_STATUS_NAMES = ["TSR_OK", "TSR_E_INVALID", "TSR_E_NOMEM", "TSR_E_DEVICE_NOMEM", "TSR_E_IO",
                 "TSR_E_MALFORMED", "TSR_E_UNSUPPORTED", "TSR_E_NOT_FOUND", "TSR_E_DEVICE",
                 "TSR_E_CANCELLED", "TSR_E_FULL", "TSR_E_TYPE", "TSR_E_STATE", "TSR_E_RANGE"]

TSR_TOKENIZE_ADD_SPECIAL, TSR_TOKENIZE_PARSE_SPECIAL = 1, 2

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q4_K, Q5_K, Q6_K = 12, 13, 14
I8, I16, I32, I64, F64, BF16 = 24, 25, 26, 27, 28, 30
ROPE_NORMAL, ROPE_NEOX = 0, 2
LOG_LEVELS = {"debug": 0, "info": 1, "warn": 2, "error": 3, "none": 4}
_FLASH = {"auto": -1, "off": 0, "on": 1, None: -1, False: 0, True: 1, -1: -1, 0: 0, 1: 1}

# numpy dtype <-> tsr_type for types numpy can hold directly
_NP_OF_TYPE = {F32: np.float32, F16: np.float16, I8: np.int8, I16: np.int16, I32: np.int32,
               I64: np.int64, F64: np.float64}
_TYPE_OF_NP = {np.dtype(v): k for k, v in _NP_OF_TYPE.items()}

# gguf value types
_G_U8, _G_I8, _G_U16, _G_I16, _G_U32, _G_I32, _G_F32, _G_BOOL, _G_STR, _G_ARR, _G_U64, _G_I64, \
    _G_F64 = range(13)
_G_NP = {_G_U8: np.uint8, _G_I8: np.int8, _G_U16: np.uint16, _G_I16: np.int16,
         _G_U32: np.uint32, _G_I32: np.int32, _G_F32: np.float32, _G_BOOL: np.uint8,
         _G_U64: np.uint64, _G_I64: np.int64, _G_F64: np.float64}

# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


class Error(Exception):
    """A libtensr failure: .status (int), .status_name, .message."""

    def __init__(self, status, message, what=None):
        self.status = int(status)
        self.status_name = (_STATUS_NAMES[self.status] if 0 <= self.status < len(_STATUS_NAMES)
                            else "status %d" % self.status)
        self.message = message or ""
        self.what = what
        desc = self.status_name
        if hasattr(_lib, "tsr_status_string"):
            desc = _s(C.status_string(self.status)) or desc
        prefix = (what + ": ") if what else ""
        super().__init__("%s%s (%s): %s" % (prefix, desc, self.status_name, self.message))


def _s(x):
    return x.decode("utf-8", "replace") if x is not None else None


def _check(status, what):
    if status != TSR_OK:
        raise Error(status, _s(C.last_error()), what)


def _cstr(s, what):
    if not isinstance(s, (str, bytes)):
        raise Error(TSR_E_INVALID, "expected a string, got %s" % type(s).__name__, what)
    b = s.encode() if isinstance(s, str) else s
    if b"\0" in b:
        raise Error(TSR_E_INVALID, "string contains a NUL byte", what)
    return b


def _call_out(what, fn, *args, types=(_P,)):
    """fn(*args, &out...) for out values of the ctypes `types`: checks the
    status and returns the values (the value itself when there is one)."""
    outs = [t() for t in types]
    _check(fn(*args, *[ctypes.byref(o) for o in outs]), what)
    return outs[0].value if len(outs) == 1 else tuple(o.value for o in outs)


def _found(h, what, fallback):
    """h, unless it is NULL: then TSR_E_NOT_FOUND with the library's message."""
    if not h:
        raise Error(TSR_E_NOT_FOUND, _s(C.last_error()) or fallback, what)
    return h


def _init_params(struct, init):
    """A params struct holding the library's defaults (init is its *_params_init)."""
    p = struct()
    init(ctypes.byref(p), ctypes.sizeof(p))
    return p


def _text(p, n):
    return ctypes.string_at(p, n).decode("utf-8", "replace")


def _buft_name(bt):
    return _s(C.buffer_type_name(bt)) if bt else None


class _Handle:
    """A library object the binding owns: close() frees it (idempotent), and
    so do the with statement and garbage collection. A subclass names the
    object for messages (_what, _gone) and the function freeing it (_free);
    one made from a parent (a Backend) is closed when the parent closes."""
    _what = "object"
    _gone = "closed"
    _free = None  # name in C of the function that frees the handle
    _h = None  # the handle; None once closed (or if opening failed)
    _parent = None
    _children = ()  # a parent's open objects (a WeakSet in a Backend)

    def _own(self, h, parent=None):
        self._h = h
        if parent is not None:
            self._parent = parent
            parent._children.add(self)

    def _closed(self):
        return self._h is None

    def _handle(self):
        if self._h is None:
            raise Error(TSR_E_STATE, "the %s is %s" % (self._what, self._gone))
        return self._h

    def close(self):
        """Frees the object, closing what was made from it first. Idempotent."""
        if self._h is None:
            return
        for child in list(self._children):
            child.close()
        getattr(C, self._free)(self._h)
        self._h = None
        if self._parent is not None:
            self._parent._children.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _getter(fn, conv=None, doc=None):
    """A read-only property: conv(C.<fn>(handle)) (or the value itself)."""
    def get(self):
        v = getattr(C, fn)(self._handle())
        return v if conv is None else conv(v)
    return property(get, doc=doc)


# ---------------------------------------------------------------------------
# Version check: refuse a library with another major version
# ---------------------------------------------------------------------------


def version():
    """The library's version string ("0.1.0")."""
    return _s(C.version_string())


def version_info():
    """The library's version as (major, minor, patch)."""
    v = C.version()
    return (v >> 16, (v >> 8) & 0xFF, v & 0xFF)


if version_info()[0] != WRITTEN_FOR[0]:
    raise ImportError("libtensr.py was written for libtensr %d.x, but %s is version %s; "
                      "install a matching libtensr or binding (set LIBTENSR_PATH)"
                      % (WRITTEN_FOR[0], _lib_path, version()))


# ---------------------------------------------------------------------------
# Types, logging
# ---------------------------------------------------------------------------


def type_name(t):
    return _s(C.type_name(int(t)))


def type_by_name(name):
    return _call_out("type_by_name", C.type_by_name, _cstr(name, "type_by_name"), types=(_I,))


def _to_type(t):
    if isinstance(t, str):
        return type_by_name(t)
    if isinstance(t, (type, np.dtype)):
        dt = np.dtype(t)
        if dt not in _TYPE_OF_NP:
            raise Error(TSR_E_TYPE, "numpy dtype %s has no libtensr type" % dt)
        return _TYPE_OF_NP[dt]
    t = int(t)
    if C.type_name(t) is None:
        raise Error(TSR_E_TYPE, "%d is not a libtensr type" % t)
    return t


def _type_of_array(a, what):
    """The libtensr type of a numpy array's dtype (float64 becomes F32)."""
    dt = np.dtype(np.float32) if a.dtype == np.float64 else a.dtype
    if dt == np.bool_:
        raise Error(TSR_E_TYPE, "bool arrays have no libtensr type", what)
    if dt not in _TYPE_OF_NP:
        raise Error(TSR_E_TYPE, "numpy dtype %s has no libtensr type" % dt, what)
    return _TYPE_OF_NP[dt]


def _encode(array, t, what):
    """array's values as type t, in contiguous memory (quantized types as bytes)."""
    try:
        if t in _NP_OF_TYPE:
            return np.ascontiguousarray(array, dtype=_NP_OF_TYPE[t])
        return np.frombuffer(quantize(array, t), np.uint8)
    except (TypeError, ValueError) as e:
        raise Error(TSR_E_TYPE, "cannot convert %s to %s: %s"
                    % (getattr(array, "dtype", type(array).__name__), type_name(t), e), what)


def _dims(shape):
    """(n_dims, ne) of a numpy-order shape: ne is libtensr's order, innermost first."""
    shape = tuple(shape)
    return len(shape), _ne_array(reversed(shape))


def type_info(type):
    """(block_size, block_bytes, is_quantized) of a type."""
    t = _to_type(type)
    return C.type_block_size(t), C.type_block_bytes(t), bool(C.type_is_quantized(t))


def fp32_to_fp16(x):
    return C.fp32_to_fp16(float(x))


def fp16_to_fp32(h):
    return C.fp16_to_fp32(int(h))


def fp32_to_bf16(x):
    return C.fp32_to_bf16(float(x))


def bf16_to_fp32(h):
    return C.bf16_to_fp32(int(h))


def clear_error():
    C.clear_error()


def last_error():
    return _s(C.last_error())


def quantize(array, type):
    """Quantizes a float array (last dim a multiple of the block size) to bytes."""
    t = _to_type(type)
    x = np.ascontiguousarray(array, dtype=np.float32)
    n = x.size
    size = C.row_size(t, n)
    if n and size == 0:
        raise Error(TSR_E_INVALID, "%d elements are not whole %s blocks" % (n, type_name(t)),
                    "quantize")
    out = ctypes.create_string_buffer(max(size, 1))
    _check(C.quantize(t, x.ctypes.data, out, n), "quantize")
    return out.raw[:size]


def dequantize(data, type, n):
    """Floats of n elements of `type` stored in bytes `data`."""
    t = _to_type(type)
    n = int(n)
    need = C.row_size(t, n)
    if len(data) < need or n < 0:
        raise Error(TSR_E_RANGE, "need %d bytes for %d %s elements, got %d"
                    % (need, n, type_name(t), len(data)), "dequantize")
    out = np.empty(n, np.float32)
    buf = ctypes.create_string_buffer(bytes(data[:need]), max(need, 1))
    _check(C.dequantize(t, buf, out.ctypes.data, n), "dequantize")
    return out


_log_keep = None


def set_log_level(level):
    """'debug', 'info', 'warn', 'error' or 'none' (or the number)."""
    C.log_set_level(LOG_LEVELS[level] if isinstance(level, str) else int(level))


def get_log_level():
    return C.log_get_level()


def set_log_callback(fn):
    """fn(level:int, msg:str, fields:dict) or None for the default (stderr)."""
    global _log_keep
    if fn is None:
        _log_keep = None
        C.log_set(ctypes.cast(None, _LOG_FN), None)
        return

    class _Field(ctypes.Structure):
        _fields_ = [("key", _STR), ("value", _STR)]

    def tramp(level, msg, fields, n, _user):
        try:
            arr = ctypes.cast(fields, _PTR(_Field))
            fn(level, _s(msg), {_s(arr[i].key): _s(arr[i].value) for i in range(n)})
        except Exception:  # never let a Python error unwind into C
            pass
    _log_keep = _LOG_FN(tramp)
    C.log_set(_log_keep, None)


def backends_available():
    return _s(C.backends_available()).split(",")

# ---------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------


class Device:
    """A compute device: .name, .description, .kind ('cpu'/'gpu'/'accel'), .free, .total."""

    def __init__(self, handle):
        self._h = handle
        self.name = _s(C.device_name(handle))
        self.description = _s(C.device_description(handle)) if hasattr(_lib, "tsr_device_description") else ""
        self.kind = {0: "cpu", 1: "gpu", 2: "accel"}.get(C.device_kind(handle), "?")
        self.free, self.total = _call_out("device_memory", C.device_memory, handle,
                                          types=(_S, _S))
        self.index_in_model = C.device_index_in_model(handle)
        self.buffer_type = _buft_name(C.device_buffer_type(handle))
        self.host_buffer_type = _buft_name(C.device_host_buffer_type(handle))

    def __repr__(self):
        return "Device(%r, %r, free=%d, total=%d)" % (self.name, self.description, self.free,
                                                       self.total)


def devices():
    """Every device: GPUs in driver order, then the CPU."""
    return [Device(C.device_get(i)) for i in range(C.device_count())]


def _device(d, what):
    """The handle of a Device or of a device name (NULL when there is none)."""
    return d._h if isinstance(d, Device) else C.device_by_name(_cstr(d, what))


def _buft(name, what):
    return _found(C.buffer_type_by_name(_cstr(name, what)), what, "no buffer type %r" % name)


class Buffer(_Handle):
    """Raw memory of a buffer type ('CPU', 'CUDA0', 'CUDA_Host'); closes on exit."""
    _what, _gone, _free = "buffer", "freed", "buffer_free"

    def __init__(self, buffer_type, size):
        self._own(_call_out("buffer_alloc", C.buffer_alloc, _buft(buffer_type, "buffer_alloc"),
                            int(size)))

    size = _getter("buffer_size")

    @property
    def buffer_type(self):
        return _buft_name(C.buffer_get_type(self._handle()))

    @property
    def device(self):
        d = C.buffer_type_device(C.buffer_get_type(self._handle()))
        return Device(d) if d else None

# ---------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------


class Tensor:
    """A tensor of a context (or a weight of a backend). Shapes are numpy's order:
    .shape == tuple(reversed(ne[:ndim]))."""

    def __init__(self, owner, handle, ndim):
        self._owner = owner  # Context or Backend: keeps it alive, tells if closed
        self._h = handle
        self._ndim = max(1, min(4, ndim))

    def _handle(self):
        if self._owner._closed():
            raise Error(TSR_E_STATE, "the %s that owns this tensor is closed"
                        % type(self._owner).__name__.lower())
        return self._h

    @property
    def ne(self):
        h = self._handle()
        return [C.tensor_ne(h, i) for i in range(4)]

    @property
    def nb(self):
        h = self._handle()
        return [C.tensor_nb(h, i) for i in range(4)]

    @property
    def ndim(self):
        return max(self._ndim, C.tensor_n_dims(self._handle()))

    @property
    def shape(self):
        return tuple(reversed(self.ne[:self.ndim]))

    type = _getter("tensor_type")
    nbytes = _getter("tensor_nbytes")
    is_contiguous = _getter("tensor_is_contiguous", bool)
    buffer_type = _getter("tensor_buffer_type", _buft_name,
                          "Name of the buffer type holding the data (None when not allocated).")
    device = _getter("tensor_device", lambda d: _s(C.device_name(d)) if d else None,
                     "Name of the device that ran this node in the last compute (or None).")

    @property
    def type_name(self):
        return type_name(self.type)

    @property
    def name(self):
        return _s(C.tensor_name(self._handle()))

    @name.setter
    def name(self, value):
        C.set_name(self._handle(), _cstr(value, "set_name"))

    def numpy(self):
        """Copies the tensor's contents out: a numpy array of .shape (quantized
        and BF16 tensors come out as float32)."""
        h = self._handle()
        t, n, size = C.tensor_type(h), C.tensor_nelements(h), C.tensor_nbytes(h)
        direct = t in _NP_OF_TYPE
        out = np.empty(self.shape, _NP_OF_TYPE[t] if direct else np.float32)
        raw = out if direct else np.empty(max(size, 1), np.uint8)
        if size:
            _check(C.tensor_read(h, raw.ctypes.data, 0, size), "tensor_read")
        if not direct and n:
            _check(C.dequantize(t, raw.ctypes.data, out.ctypes.data, n), "dequantize")
        return out

    def write(self, array):
        """Copies a numpy array in (same number of elements; converted to the
        tensor's type, quantizing if needed), or `bytes` as they are."""
        h = self._handle()
        if isinstance(array, (bytes, bytearray, memoryview)):
            x = np.frombuffer(bytes(array), np.uint8)
        else:
            x = _encode(array, C.tensor_type(h), "tensor_write")
        size = C.tensor_nbytes(h)
        if x.nbytes != size:
            raise Error(TSR_E_INVALID, "%d bytes given for a tensor of %d bytes (shape %s)"
                        % (x.nbytes, size, self.shape), "tensor_write")
        if size:
            _check(C.tensor_write(h, x.ctypes.data, 0, size), "tensor_write")

    def __repr__(self):
        try:
            return "Tensor(%r, shape=%s, type=%s)" % (self.name, self.shape, self.type_name)
        except Error:
            return "Tensor(<closed>)"

    # operators build nodes in the tensor's context
    def __add__(self, o):
        return self._owner_ctx(o).add(self, o)

    def __sub__(self, o):
        return self._owner_ctx(o).sub(self, o)

    def __mul__(self, o):
        ctx = self._owner_ctx(o)
        return ctx.scale(self, o) if isinstance(o, (int, float)) else ctx.mul(self, o)

    def __truediv__(self, o):
        return self._owner_ctx(o).div(self, o)

    def __matmul__(self, o):
        """a @ b == ctx.mul_mat(a, b) (tsr_mul_mat's meaning, not numpy's)."""
        return self._owner_ctx(o).mul_mat(self, o)

    def _owner_ctx(self, other):
        for t in (self, other):
            if isinstance(t, Tensor) and isinstance(t._owner, Context):
                return t._owner
        raise Error(TSR_E_INVALID, "operators need a tensor of a context (weights have none)")


def _as_tensor(x, ctx, what):
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        return ctx.input(x)
    if not isinstance(x, Tensor):
        raise Error(TSR_E_INVALID, "expected a Tensor or a numpy array, got %s"
                    % type(x).__name__, what)
    x._handle()
    if isinstance(x._owner, Context) and x._owner is not ctx:
        raise Error(TSR_E_INVALID, "tensor belongs to another context", what)
    return x


def _ne_array(ne):
    ne = [int(v) for v in ne]
    if not 1 <= len(ne) <= 4:
        raise Error(TSR_E_INVALID, "1 to 4 dimensions, got %d" % len(ne))
    if any(v < 0 for v in ne):
        raise Error(TSR_E_INVALID, "negative dimension in %s" % ne)
    return (_I64 * len(ne))(*ne)


# ---------------------------------------------------------------------------
# Contexts
# ---------------------------------------------------------------------------


def _op_method(name, n_tensors, doc=None):
    """Context.<name>(a[, b]): the graph op tsr_<name> of one or two tensors."""
    if n_tensors == 1:
        def op(self, a):
            return self._op(name, (a,), None)
    else:
        def op(self, a, b):
            return self._op(name, (a, b), None)
    op.__name__, op.__qualname__, op.__doc__ = name, "Context." + name, doc
    return op


def _eps_method(name):
    """Context.<name>(a, eps): a normalization op."""
    def op(self, a, eps=1e-5):
        return self._op(name, (a,), None, float(eps))
    op.__name__, op.__qualname__ = name, "Context." + name
    return op


class Context(_Handle):
    """An arena for one forward pass: inputs, ops, compute; closes on exit."""
    _what, _free = "context", "context_close"

    def __init__(self, backend):
        h = C.context_new(backend._handle())
        if not h:
            raise Error(TSR_E_NOMEM, _s(C.last_error()), "context_new")
        self._own(h, backend)

    @property
    def backend(self):
        return self._parent

    error = _getter("context_error", _s, "The first op error recorded in the context, or None.")

    def _fail(self, status, what):
        """Raises the context's recorded error (with `status`, TSR_E_INVALID if none)."""
        raise Error(status if status != TSR_OK else TSR_E_INVALID,
                    _s(C.context_error(self._h)) or _s(C.last_error()), what)

    def _wrap(self, h, ndim, what):
        if not h:
            self._fail(C.context_status(self._handle()), what)
        return Tensor(self, h, ndim)

    # -- tensors -----------------------------------------------------------
    def input(self, array, type=None):
        """A tensor holding a copy of `array` (shape (.., m, k) -> ne [k, m, ..]).
        float64 arrays become F32 unless type says otherwise; type may be a
        tsr type number or name ('f16', 'q8_0') to convert while copying in."""
        h = self._handle()
        if not isinstance(array, np.ndarray):
            try:
                array = np.asarray(array)
            except Exception as e:
                raise Error(TSR_E_INVALID, "not convertible to an array: %s" % e, "input")
        if array.ndim > 4:
            raise Error(TSR_E_INVALID, "at most 4 dimensions, got shape %s" % (array.shape,),
                        "input")
        shape = array.shape if array.ndim else (1,)
        t = _type_of_array(array, "input") if type is None else _to_type(type)
        x = _encode(array, t, "input")
        if not x.nbytes:  # never hand the library a NULL pointer
            x = np.zeros(1, np.uint8)
        return self._wrap(C.input(h, t, *_dims(shape), x.ctypes.data), len(shape), "input")

    def new_tensor(self, shape, type=F32, buffer_type=None):
        """A zero-filled tensor allocated now (numpy-order shape)."""
        bt = _buft(buffer_type, "new_tensor") if buffer_type is not None else None
        n, ne = _dims(shape)
        return self._wrap(C.new_tensor(self._handle(), bt, _to_type(type), n, ne), n,
                          "new_tensor")

    def empty(self, shape, type=F32):
        n, ne = _dims(shape)
        return self._wrap(C.empty(self._handle(), _to_type(type), n, ne), n, "empty")

    # -- ops -----------------------------------------------------------------
    def _op(self, name, args, ndim, *extra):
        h = self._handle()
        ts = [_as_tensor(a, self, name) for a in args]
        hs = [t._h if t is not None else None for t in ts]
        if ndim is None:
            ndim = max([t._ndim for t in ts if t is not None] or [1])
        return self._wrap(getattr(C, name)(h, *hs, *extra), ndim, name)

    add = _op_method("add", 2)
    sub = _op_method("sub", 2)
    mul = _op_method("mul", 2)
    div = _op_method("div", 2)
    mul_mat = _op_method("mul_mat", 2, """a [k, m] x b [k, n] -> [m, n]: result[j][i] =
        sum_k a[i][k] b[j][k]; in numpy terms c.numpy() == b @ a.T.""")
    swiglu = _op_method("swiglu", 2)
    geglu = _op_method("geglu", 2)
    silu = _op_method("silu", 1)
    gelu = _op_method("gelu", 1)
    cont = _op_method("cont", 1)
    rms_norm = _eps_method("rms_norm")
    norm = _eps_method("norm")

    def scale(self, a, s):
        return self._op("scale", (a,), None, float(s))

    def get_rows(self, a, idx):
        return self._op("get_rows", (a, idx), None)

    def set_rows(self, dst, src, idx):
        return self._op("set_rows", (dst, src, idx), None)

    def rope(self, a, pos, n_dims, mode=ROPE_NORMAL, freq_base=10000.0, freq_scale=1.0,
             freq_factors=None, n_ctx_orig=0, ext_factor=0.0, attn_factor=1.0,
             beta_fast=32.0, beta_slow=1.0):
        if freq_factors is None and ext_factor == 0.0 and attn_factor == 1.0:
            return self._op("rope", (a, pos), None, int(n_dims), int(mode), float(freq_base),
                            float(freq_scale))
        return self._op("rope_ext", (a, pos, freq_factors), None, int(n_dims), int(mode),
                        int(n_ctx_orig), float(freq_base), float(freq_scale), float(ext_factor),
                        float(attn_factor), float(beta_fast), float(beta_slow))

    def softmax(self, a, mask=None, scale=1.0):
        if mask is None and scale == 1.0:
            return self._op("softmax", (a,), None)
        return self._op("softmax_ext", (a, mask), None, float(scale))

    def concat(self, a, b, dim):
        """dim in libtensr's numbering (0 = innermost = numpy's last axis)."""
        return self._op("concat", (a, b), None, int(dim))

    sigmoid = _op_method("sigmoid", 1)
    sum_rows = _op_method("sum_rows", 1, """Sum of each row (numpy: keepdims sum over the last axis).""")

    def mul_mat_id(self, as_, b, ids):
        """Experts as_ [k, m, n_expert], b [k, 1 or n_used, n_tokens], ids I32 [n_used, n_tokens]
        (libtensr order) -> [m, n_used, n_tokens]: slot e of token t through expert ids[t][e]."""
        return self._op("mul_mat_id", (as_, b, ids), 3)

    def top_k(self, a, k):
        """Indices of the k largest values of each row, largest first (I32)."""
        return self._op("top_k", (a,), None, int(k))

    def argsort(self, a, descending=False):
        """Indices that sort each row (stable), I32."""
        return self._op("argsort", (a,), None, 1 if descending else 0)

    def argmax(self, a):
        t = _as_tensor(a, self, "argmax")
        return self._op("argmax", (t,), max(1, t._ndim - 1))

    def cpy(self, a, b):
        return self._op("cpy", (a, b), _as_tensor(b, self, "cpy")._ndim)

    def cast(self, a, type):
        return self._op("cast", (a,), None, _to_type(type))

    def view(self, a, ne, nb=None, offset=0):
        """A view with libtensr-order ne (1 to 4 dims), byte strides nb[1:] and offset."""
        ne = [int(v) for v in ne]
        t = _as_tensor(a, self, "view")
        nb = list(nb) if nb is not None else t.nb[1:len(ne)]
        if len(ne) not in (1, 2, 3, 4) or len(nb) < len(ne) - 1:
            raise Error(TSR_E_INVALID, "view needs 1 to 4 dims and len(ne)-1 strides", "view")
        args = ne + [int(v) for v in nb[:len(ne) - 1]] + [int(offset)]
        return self._op("view_%dd" % len(ne), (t,), len(ne), *args)

    def reshape(self, a, shape):
        """Reshape to a numpy-order shape (same number of elements, contiguous a)."""
        shape = tuple(int(v) for v in shape)
        return self._op("reshape", (a,), len(shape), *_dims(shape))

    def permute(self, a, axis0, axis1, axis2, axis3):
        return self._op("permute", (a,), 4, int(axis0), int(axis1), int(axis2), int(axis3))

    def transpose(self, a):
        t = _as_tensor(a, self, "transpose")
        return self._op("transpose", (t,), max(2, t._ndim))

    def flash_attn(self, q, k, v, mask=None, scale=1.0):
        return self._op("flash_attn", (q, k, v, mask), 4, float(scale))

    def attention(self, cache, il, q, k, v, scale):
        """Attention of layer il over the KV cache (see tsr_attention(3))."""
        if not isinstance(cache, KVCache):
            raise Error(TSR_E_INVALID, "expected a KVCache", "attention")
        hs = [_as_tensor(x, self, "attention")._h for x in (q, k, v)]
        return self._wrap(C.attention(self._handle(), cache._handle(), int(il), *hs,
                                      float(scale)), 2, "attention")

    def attention_nocache(self, q, k, v, mask=None, scale=1.0):
        return self._op("attention_nocache", (q, k, v, mask), 2, float(scale))

    # -- compute -------------------------------------------------------------
    def _graph(self, outs, what):
        """(context handle, array of output handles, count) of compute's arguments."""
        h = self._handle()
        if len(outs) == 1 and isinstance(outs[0], (list, tuple)):
            outs = outs[0]
        if not outs:
            raise Error(TSR_E_INVALID, "no outputs given", what)
        ts = [_as_tensor(t, self, what) for t in outs]
        return h, (_T * len(ts))(*[t._h for t in ts]), len(ts)

    def compute(self, *outs):
        """Runs the graph that produces the outputs (one or several tensors, or a list)."""
        st = C.compute(*self._graph(outs, "compute"))
        if st != TSR_OK:
            self._fail(st, "compute")

    def reserve(self, *outs):
        _check(C.reserve(*self._graph(outs, "reserve")), "reserve")

    def measure(self, *outs):
        """Peak compute bytes per backend device for this graph."""
        args = self._graph(outs, "measure")
        sizes = (_S * max(1, C.backend_n_devices(self._parent._handle())))()
        _check(C.measure(*args, sizes), "measure")
        return list(sizes)


# ---------------------------------------------------------------------------
# Backend, weights, KV cache
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def _load_params(what, n_gpu_layers=0, main_gpu=0, tensor_split=None, overrides=None,
                 use_mmap=False, n_io_threads=0, progress=None, verify=False, vocab_only=False):
    """A tsr_load_params for the with block: overrides ('regex=BUFT,...') parsed
    by tsr_buft_overrides_parse and freed at the end, progress(done, total) ->
    True to cancel (kept alive as long as the block runs)."""
    p = _init_params(_LoadParams, C.load_params_init)
    p.n_gpu_layers, p.main_gpu = int(n_gpu_layers), int(main_gpu)
    p.use_mmap, p.n_io_threads, p.verify = int(bool(use_mmap)), int(n_io_threads), int(verify)
    p.vocab_only = int(bool(vocab_only))
    if tensor_split is not None:
        p.tensor_split = (ctypes.c_float * len(tensor_split))(*tensor_split)
    ov = _PTR(_BuftOverride)()
    if overrides:
        _check(C.buft_overrides_parse(_cstr(overrides, what), ctypes.byref(ov)), "overrides")
        p.overrides = ov
    if progress is not None:
        def tramp(done, total, _u):
            try:
                return 1 if progress(done, total) else 0
            except Exception:
                return 1
        p.progress = _PROGRESS_FN(tramp)
    try:
        yield p
    finally:
        if ov:
            C.buft_overrides_free(ov)


def fit(path, n_ctx=0, n_gpu_layers=None, tensor_split=None, overrides=None, margins=None,
        gpu_margin=1 << 30, host_margin=0, n_ctx_min=4096, prefer="context", keep_n_ctx=False,
        n_ubatch=512, n_seq_max=1):
    """tsr_fit: the largest placement of the model at path that fits the devices
    and system memory. n_gpu_layers (given: kept), tensor_split, overrides
    ('regex=BUFT,...', kept first) and n_ctx (0: the training context; shrunk
    down to n_ctx_min unless keep_n_ctx) are the caller's; margins: bytes per
    device (GPUs, then the CPU). Returns a dict: n_gpu_layers, n_cpu_moe, n_ctx,
    tensor_split, overrides [(pattern, buffer type)], flags (tensr-run's),
    planned and available bytes per device, seconds."""
    if prefer not in ("context", "speed"):
        raise Error(TSR_E_INVALID, "prefer is 'context' or 'speed', not %r" % (prefer,), "fit")
    fp = _init_params(_FitParams, C.fit_params_init)
    fp.gpu_margin, fp.host_margin, fp.n_ctx_min = int(gpu_margin), int(host_margin), int(n_ctx_min)
    fp.prefer, fp.keep_n_ctx = int(prefer == "speed"), int(bool(keep_n_ctx))
    fp.keep_n_gpu_layers = int(n_gpu_layers is not None)
    if margins is not None:
        arr = (_S * len(margins))(*[int(m) for m in margins])
        fp.margins, fp.n_margins = ctypes.cast(arr, _PTR(_S)), len(margins)
    sp = _init_params(_SessionParams, C.session_params_init)
    sp.n_ctx, sp.n_ubatch, sp.n_seq_max = int(n_ctx), int(n_ubatch), int(n_seq_max)
    r = _FitResult()
    r.size = ctypes.sizeof(r)
    with _load_params("fit", n_gpu_layers or 0, tensor_split=tensor_split,
                      overrides=overrides) as lp:
        st = C.fit(_path(path, "fit"), None, ctypes.byref(lp), ctypes.byref(sp), ctypes.byref(fp),
                   ctypes.byref(r))
    try:
        _check(st, "fit")
        buf = ctypes.create_string_buffer(8192)
        n = _S()
        _check(C.fit_result_flags(ctypes.byref(r), buf, len(buf), ctypes.byref(n)), "fit")
        ovs = []
        for i in range(1 << 16):
            if not r.overrides or not r.overrides[i].pattern:
                break
            ovs.append((_s(r.overrides[i].pattern), _buft_name(r.overrides[i].buft)))
        n_gpu = max(int(r.n_devices) - 1, 0)
        return {"n_gpu_layers": r.n_gpu_layers, "n_cpu_moe": r.n_cpu_moe, "n_ctx": r.n_ctx,
                "tensor_split": list(r.tensor_split[:n_gpu]), "overrides": ovs,
                "flags": _s(buf.value), "planned": list(r.planned[:r.n_devices]),
                "available": list(r.available[:r.n_devices]), "n_layers": r.n_layers,
                "seconds": r.seconds}
    finally:
        C.fit_result_free(ctypes.byref(r))


class Backend(_Handle):
    """The engine: devices in use, one scheduler, the weights. Closes on exit
    (closing its contexts and KV caches first)."""
    _what, _free = "backend", "backend_free"

    def __init__(self, n_threads=0, devices=None, flash_attn="auto", attn_max_batch=0, batch_invariant=False):
        p = _init_params(_BackendParams, C.backend_params_init)
        p.batch_invariant = 1 if batch_invariant else 0
        p.n_threads = int(n_threads)
        if flash_attn not in _FLASH:
            raise Error(TSR_E_INVALID, "flash_attn is 'auto', 'on' or 'off', not %r"
                        % (flash_attn,), "Backend")
        p.flash_attn = _FLASH[flash_attn]
        p.attn_max_batch = int(attn_max_batch)
        if devices is not None:
            hs = [_found(_device(d, "Backend"), "Backend", "no device %r" % d) for d in devices]
            devs = (_P * (len(hs) + 1))(*hs, None)
            p.devices = ctypes.cast(devs, _P)
        self._children = weakref.WeakSet()
        self._own(_call_out("backend_new", C.backend_new, ctypes.byref(p)))

    def context(self):
        return Context(self)

    n_threads = _getter("backend_n_threads")
    flash_attn = _getter("backend_flash_attn", bool)
    n_layers = _getter("backend_n_layers")
    attn_max_batch = _getter("backend_attn_max_batch")
    n_splits = _getter("backend_n_splits", doc="Splits of the last compute/reserve.")
    n_copies = _getter("backend_n_copies")

    @property
    def devices(self):
        h = self._handle()
        return [Device(C.backend_device(h, i)) for i in range(C.backend_n_devices(h))]

    def load(self, path, n_gpu_layers=0, main_gpu=0, tensor_split=None, overrides=None,
             use_mmap=False, n_io_threads=0, progress=None, verify=False):
        """Loads a GGUF file's tensors as weights. overrides: 'regex=BUFT,...';
        progress(done, total) -> True to cancel."""
        with _load_params("load", n_gpu_layers, main_gpu, tensor_split, overrides, use_mmap,
                          n_io_threads, progress, verify) as p:
            _check(C.backend_load_gguf(self._handle(), _cstr(os.fspath(path), "load"),
                                       ctypes.byref(p)), "load_gguf")

    def declare_weight(self, name, shape, type=F32):
        _check(C.backend_declare_weight(self._handle(), _cstr(name, "declare_weight"),
                                        _to_type(type), *_dims(shape)), "declare_weight")

    def place_weights(self):
        p = _init_params(_LoadParams, C.load_params_init)
        _check(C.backend_place_weights(self._handle(), ctypes.byref(p)), "place_weights")

    def _weight(self, h, name, what):
        _found(h, what, "no weight %r" % name)
        return Tensor(self, h, C.tensor_n_dims(h))

    def weight(self, name):
        return self._weight(C.backend_weight(self._handle(), _cstr(name, "weight")), name,
                            "weight")

    def weight_on(self, name, device):
        """The weight's copy on `device` (a Device or a name), else the weight."""
        d = _device(device, "weight_on")
        return self._weight(C.backend_weight_on(self._handle(), _cstr(name, "weight_on"), d),
                            name, "weight_on")

    def weight_names(self):
        h = self._handle()
        return [_s(C.tensor_name(C.backend_weight_at(h, i))) for i in range(C.backend_n_weights(h))]

    def layer_buffer_type(self, il):
        return _buft_name(C.backend_layer_buffer_type(self._handle(), int(il)))

    def memory_plan(self):
        """Per device of the backend: {'device', 'weights', 'kv_cache', 'compute'} bytes."""
        h = self._handle()
        out = []
        for i in range(C.backend_n_devices(h)):
            w, kv, c = _call_out("memory_plan", C.backend_memory_plan, h, i, types=(_S, _S, _S))
            out.append({"device": _s(C.device_name(C.backend_device(h, i))), "weights": w,
                        "kv_cache": kv, "compute": c})
        return out

    def log_plan(self):
        C.backend_log_plan(self._handle())

    def kv_cache(self, n_layers, n_ctx, n_head_kv, head_dim_k, head_dim_v=None, type_k=F16,
                 type_v=None, n_seq=1, n_batch_max=512):
        return KVCache(self, n_layers, n_ctx, n_head_kv, head_dim_k,
                       head_dim_k if head_dim_v is None else head_dim_v, type_k,
                       type_k if type_v is None else type_v, n_seq, n_batch_max)


class KVCache(_Handle):
    """Per-layer K/V of past tokens (see tsr_kv_cache_new(3))."""
    _what, _free = "KV cache", "kv_cache_free"

    def __init__(self, backend, n_layers, n_ctx, n_head_kv, head_dim_k, head_dim_v, type_k,
                 type_v, n_seq, n_batch_max):
        p = _init_params(_KVCacheParams, C.kv_cache_params_init)
        p.n_layers, p.n_ctx, p.n_head_kv = int(n_layers), int(n_ctx), int(n_head_kv)
        p.head_dim_k, p.head_dim_v = int(head_dim_k), int(head_dim_v)
        p.type_k, p.type_v = _to_type(type_k), _to_type(type_v)
        p.n_seq, p.n_batch_max = int(n_seq), int(n_batch_max)
        self._own(_call_out("kv_cache_new", C.kv_cache_new, backend._handle(), ctypes.byref(p)),
                  backend)

    def _begin(self, fn, what, ctx, pos, seq):
        pos = np.ascontiguousarray(pos, dtype=np.int32).reshape(-1)
        sp = None
        if seq is not None:
            seq = np.ascontiguousarray(seq, dtype=np.int32).reshape(-1)
            if seq.size != pos.size:
                raise Error(TSR_E_INVALID, "seq and pos differ in length", what)
            sp = seq.ctypes.data_as(_PTR(_I32))
        _check(fn(self._handle(), ctx._handle(), pos.size, pos.ctypes.data_as(_PTR(_I32)), sp), what)

    def begin(self, ctx, pos, seq=None):
        """Starts a batch at positions pos (sequence ids seq) in context ctx."""
        self._begin(C.kv_cache_begin, "kv_cache_begin", ctx, pos, seq)

    def begin_again(self, ctx, pos, seq=None):
        """Starts the next batch on the inputs the last begin made in ctx (a graph
        computed again); Error with TSR_E_STATE, nothing changed, when the batch
        has another size or needs another number of cells read."""
        self._begin(C.kv_cache_begin_again, "kv_cache_begin_again", ctx, pos, seq)

    def begin_reserve(self, ctx, n_tokens):
        """Inputs of a worst-case batch over the whole cache, for ctx.reserve() or
        ctx.measure() (never compute such a graph); the cells are not touched."""
        _check(C.kv_cache_begin_reserve(self._handle(), ctx._handle(), int(n_tokens)),
               "kv_cache_begin_reserve")

    def clear(self):
        C.kv_cache_clear(self._handle())

    def remove(self, seq=-1, p0=0, p1=-1):
        _check(C.kv_cache_remove(self._handle(), int(seq), int(p0), int(p1)), "kv_cache_remove")

    def mask(self, ctx):
        """The mask input the last begin() built in ctx."""
        h = C.kv_cache_mask(self._handle())
        if not h:
            raise Error(TSR_E_STATE, "no batch begun", "kv_cache_mask")
        return Tensor(ctx, h, 2)

    def seq_pos_max(self, seq=-1):
        """The largest position of sequence seq (-1: any) in the cache; -1 when none."""
        return C.kv_cache_seq_pos_max(self._handle(), _int32(seq, "seq_pos_max", "seq"))

    used = _getter("kv_cache_used")
    n_ctx = _getter("kv_cache_n_ctx")


# ---------------------------------------------------------------------------
# GGUF inspection and writing
# ---------------------------------------------------------------------------


class TensorInfo:
    def __init__(self, name, type, ne, offset, size):
        self.name, self.type, self.ne, self.offset, self.size = name, type, ne, offset, size

    @property
    def shape(self):
        return tuple(reversed(self.ne))

    def __repr__(self):
        return "TensorInfo(%r, %s, ne=%s)" % (self.name, type_name(self.type), self.ne)


# key type -> (typed getter, ctypes type of its value); other integers read as i64
_GGUF_GET = {_G_BOOL: ("gguf_get_bool", _I), _G_F32: ("gguf_get_f32", ctypes.c_float),
             _G_F64: ("gguf_get_f64", ctypes.c_double), _G_U64: ("gguf_get_u64", _U64),
             _G_U32: ("gguf_get_u32", _U32)}
_GGUF_GET.update({t: ("gguf_get_i32", _I32) for t in (_G_U8, _G_I8, _G_U16, _G_I16, _G_I32)})


class GGUF(_Handle):
    """A GGUF file's metadata: g.keys(), g[key] / g.get(key), g.tensors(),
    g.read_tensor(name). Closes on exit."""
    _what, _free = "GGUF file", "gguf_close"

    def __init__(self, path=None, data=None, name=None):
        if data is not None:  # from memory (copied by the library)
            buf = bytes(data)
            h = _call_out("gguf_open_memory", C.gguf_open_memory, buf, len(buf),
                          _cstr(name or "<memory>", "gguf_open"), 0)
        else:
            h = _call_out("gguf_open", C.gguf_open, _cstr(os.fspath(path), "gguf_open"))
        self._own(h)

    @classmethod
    def from_bytes(cls, data, name=None):
        return cls(data=data, name=name)

    alignment = _getter("gguf_alignment")
    data_offset = _getter("gguf_data_offset")
    path = _getter("gguf_path", _s)
    version = _getter("gguf_version")

    def _key(self, key, what):
        """(handle, key as bytes, key index); KeyError when absent."""
        h, k = self._handle(), _cstr(key, what)
        i = C.gguf_find_key(h, k)
        if i < 0:
            raise KeyError(key)
        return h, k, i

    def raw(self, key):
        """The bytes of a scalar key's value as stored in the file."""
        h, k, i = self._key(key, "gguf_raw")
        return ctypes.string_at(*_call_out(_s(k), C.gguf_get_raw, h, i, types=(_P, _S)))

    def keys(self):
        h = self._handle()
        return [_s(C.gguf_key_name(h, i)) for i in range(C.gguf_n_keys(h))]

    def __contains__(self, key):
        return C.gguf_find_key(self._handle(), _cstr(key, "gguf")) >= 0

    def __getitem__(self, key):
        h, k, i = self._key(key, "gguf_get")
        t = C.gguf_key_type(h, i)
        if t == _G_STR:
            return _text(*_call_out(_s(k), C.gguf_get_str, h, k, types=(_P, _S)))
        if t == _G_ARR:
            return self._array(k)
        fn, ctype = _GGUF_GET.get(t, ("gguf_get_i64", _I64))
        v = _call_out(_s(k), getattr(C, fn), h, k, types=(ctype,))
        return bool(v) if t == _G_BOOL else v

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def _array(self, k):
        h, what = self._h, _s(k)
        et, n = _call_out(what, C.gguf_get_arr_info, h, k, types=(_I, _U64))
        if et == _G_STR:
            return [_text(*_call_out(what, C.gguf_get_arr_str, h, k, i, types=(_P, _S)))
                    for i in range(n)]
        if et not in _G_NP:
            raise Error(TSR_E_UNSUPPORTED, "array of type %d" % et, what)
        dt = np.dtype(_G_NP[et])
        if n == 0:
            return np.empty(0, dt)
        p = _call_out(what, C.gguf_get_arr_data, h, k)
        arr = np.frombuffer(ctypes.string_at(p, n * dt.itemsize), dtype=dt.newbyteorder("<"))
        return arr.astype(bool) if et == _G_BOOL else arr.astype(dt)

    def _ne(self, h, i):
        return [C.gguf_tensor_ne(h, i, d) for d in range(C.gguf_tensor_n_dims(h, i))]

    def tensors(self):
        h = self._handle()
        return [TensorInfo(_s(C.gguf_tensor_name(h, i)), C.gguf_tensor_type(h, i),
                           self._ne(h, i), C.gguf_tensor_offset(h, i), C.gguf_tensor_size(h, i))
                for i in range(C.gguf_n_tensors(h))]

    def read_tensor(self, name, raw=False):
        """A tensor's data as numpy (quantized types dequantized to float32),
        or its bytes as stored when raw is true."""
        h = self._handle()
        i = C.gguf_find_tensor(h, _cstr(name, "read_tensor"))
        if i < 0:
            raise Error(TSR_E_NOT_FOUND, "no tensor %r" % name, "read_tensor")
        t, size = C.gguf_tensor_type(h, i), C.gguf_tensor_size(h, i)
        shape = tuple(reversed(self._ne(h, i)))
        buf = ctypes.create_string_buffer(max(size, 1))
        _check(C.gguf_read_tensor(h, i, buf, size), "read_tensor")
        data = buf.raw[:size]
        if raw:
            return data
        if t in _NP_OF_TYPE:
            return np.frombuffer(data, _NP_OF_TYPE[t]).reshape(shape).copy()
        return dequantize(data, t, int(np.prod(shape))).reshape(shape)


# GGUFWriter.set: Python type -> (gguf value type, ctypes type); bool before int
_WRITER_SCALARS = ((bool, _G_BOOL, ctypes.c_uint8), (int, _G_I64, _I64),
                   (float, _G_F32, ctypes.c_float))
_G_OF_NP = {np.dtype(v): t for t, v in _G_NP.items() if t != _G_BOOL}


class GGUFWriter(_Handle):
    """Collects keys and tensors; write(path)."""
    _what, _free = "writer", "gguf_writer_free"

    def __init__(self):
        self._own(_call_out("gguf_writer_new", C.gguf_writer_new))

    def set(self, key, value):
        """str, bool, int (INT64), float (FLOAT32), list of str, or numpy array."""
        h, k = self._handle(), _cstr(key, "gguf_writer_set")
        if isinstance(value, str):
            _check(C.gguf_writer_set_str(h, k, _cstr(value, key)), key)
            return
        for pytype, gtype, ctype in _WRITER_SCALARS:
            if isinstance(value, pytype):
                _check(C.gguf_writer_set(h, k, gtype, ctypes.byref(ctype(value))), key)
                return
        if isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value):
            arr = (_STR * max(1, len(value)))(*[_cstr(x, key) for x in value])
            _check(C.gguf_writer_set_arr_str(h, k, arr, len(value)), key)
            return
        a = np.ascontiguousarray(value)
        if a.dtype not in _G_OF_NP:
            raise Error(TSR_E_TYPE, "cannot store %s in GGUF" % a.dtype, key)
        _check(C.gguf_writer_set_arr(h, k, _G_OF_NP[a.dtype], a.ctypes.data, a.size), key)

    def add_tensor(self, name, array, type=None):
        a = np.asarray(array)
        if a.ndim == 0 or a.ndim > 4:
            raise Error(TSR_E_INVALID, "1 to 4 dimensions, got %d" % a.ndim, "add_tensor")
        t = _type_of_array(a, "add_tensor") if type is None else _to_type(type)
        x = _encode(a, t, "add_tensor")
        _check(C.gguf_writer_add_tensor(self._handle(), _cstr(name, "add_tensor"), t,
                                        *_dims(a.shape), x.ctypes.data), name)

    def set_alignment(self, alignment):
        _check(C.gguf_writer_set_alignment(self._handle(), int(alignment)), "set_alignment")

    def copy_keys(self, gguf):
        """Copies every key of an open GGUF (except general.alignment)."""
        _check(C.gguf_writer_copy_keys(self._handle(), gguf._handle()), "copy_keys")

    def write(self, path):
        _check(C.gguf_writer_write_file(self._handle(), _cstr(os.fspath(path), "write")),
               "gguf_write")

    def to_bytes(self):
        p, n = _call_out("gguf_write_memory", C.gguf_writer_write_memory, self._handle(),
                         types=(_P, _S))
        try:
            return ctypes.string_at(p, n)
        finally:
            C.free(p)


# ---------------------------------------------------------------------------
# Model layer: Model, Session, Sampler (tsr_model_*, tsr_session_*, tsr_sampler_*)
# ---------------------------------------------------------------------------

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


def _int32(v, what, name):
    """An integer argument that must fit int32 (ctypes would wrap it silently)."""
    try:
        if isinstance(v, (bool, np.bool_)) or int(v) != v:
            raise TypeError
        v = int(v)
    except (TypeError, ValueError, OverflowError):
        raise Error(TSR_E_INVALID, "%s must be an integer, got %r" % (name, v), what) from None
    if not _I32_MIN <= v <= _I32_MAX:
        raise Error(TSR_E_INVALID, "%s %d is outside int32" % (name, v), what)
    return v


def _int32s(values, what, name):
    """A sequence (or array) of integers as a contiguous int32 array; values
    outside int32 and non-integers raise tsr.Error (never wrap or truncate)."""
    try:
        a = np.asarray(values)
    except Exception as e:
        raise Error(TSR_E_INVALID, "%s: not a sequence of integers (%s)" % (name, e),
                    what) from None
    a = a.reshape(-1)
    if a.size == 0:
        return np.zeros(0, np.int32)
    if a.dtype.kind not in "iu":
        raise Error(TSR_E_INVALID, "%s must be integers, got %s" % (name, a.dtype), what)
    if int(a.min()) < _I32_MIN or int(a.max()) > _I32_MAX:
        raise Error(TSR_E_INVALID, "%s: a value outside int32" % name, what)
    return np.ascontiguousarray(a, dtype=np.int32)


def _p32(a):
    return a.ctypes.data_as(_PTR(_I32))


def _grow(what, fn, *args, cap=256):
    """fn(*args, buf, cap, &len) -> the bytes written. A TSR_E_RANGE (the
    buffer is too small; len is the full length) is retried with len + 1
    bytes (room for the NUL of the functions that write one)."""
    cap = max(int(cap), 1)
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = _S()
        st = fn(*args, buf, cap, ctypes.byref(n))
        if st == TSR_E_RANGE and n.value + 1 > cap:
            cap = n.value + 1
            continue
        _check(st, what)
        return buf.raw[:n.value]


def _path(path, what):
    try:
        return _cstr(os.fspath(path), what)
    except TypeError:
        raise Error(TSR_E_INVALID, "expected a path, got %s" % type(path).__name__, what) from None


class _ModelBackend(Backend):
    """The backend a Model owns: closed by its model, after the model (its
    close() does nothing, so that neither the user nor the garbage collector
    can free it under the model)."""
    _what = "model's backend"

    def close(self):
        pass

    def _release(self):
        Backend.close(self)


class _ModelChild(_Handle):
    """A session or sampler of a model. It keeps its model alive; the model
    holds its handle in a shared cell, so that closing the model (or the
    garbage collector finalizing both, in whatever order) frees the child
    first and the child sees that it is gone."""
    _cell = None
    _model = None

    def _own_in(self, h, model):
        self._cell = [h]
        self._h = h
        self._model = model
        model._cells[id(self._cell)] = (self._free, self._cell)

    def _handle(self):
        if self._cell is None or self._cell[0] is None:
            self._h = None
            raise Error(TSR_E_STATE, "the %s is closed (or its model is)" % self._what)
        return self._cell[0]

    @property
    def model(self):
        return self._model

    def close(self):
        """Frees the object. Idempotent."""
        cell, self._h = self._cell, None
        if cell is None:
            return
        if cell[0] is not None:
            h, cell[0] = cell[0], None
            getattr(C, self._free)(h)
        if self._model is not None and self._model._cells is not None:
            self._model._cells.pop(id(cell), None)


class Session(_ModelChild):
    """A KV cache of up to n_seq sequences over a model (tsr_session_*):
    decode() runs tokens and returns the logits rows asked for; remove()
    forgets positions. Made by Model.session(); closes on exit."""
    _what, _free = "session", "session_free"

    def __init__(self, model, n_ctx=0, n_seq=1, n_batch=0, n_ubatch=0, n_outputs_max=0,
                 type_k=F16, type_v=None):
        if not isinstance(model, Model):
            raise Error(TSR_E_INVALID, "expected a Model, got %s" % type(model).__name__,
                        "session")
        p = _init_params(_SessionParams, C.session_params_init)
        for field, v in (("n_ctx", n_ctx), ("n_batch", n_batch), ("n_ubatch", n_ubatch),
                         ("n_outputs_max", n_outputs_max)):
            v = _int32(v, "session", field)
            if v or field == "n_ctx":  # 0: the library's default
                setattr(p, field, v)
        p.n_seq_max = _int32(n_seq, "session", "n_seq")
        p.type_k = _to_type(type_k)
        p.type_v = p.type_k if type_v is None else _to_type(type_v)
        h = _call_out("session_new", C.session_new, model._handle(), ctypes.byref(p))
        self._own_in(h, model)
        self._n_vocab = model.n_vocab
        self._n_seq = max(1, p.n_seq_max)  # 0 means 1

    n_ctx = _getter("session_n_ctx", doc="KV cells of the session (shared by its sequences).")

    @property
    def n_seq(self):
        return self._n_seq

    def n_past(self, seq=0):
        """The next position of sequence seq (0 when it holds none)."""
        n = C.session_n_past(self._handle(), _int32(seq, "n_past", "seq"))
        if n < 0:
            raise Error(TSR_E_INVALID, "sequence %r is outside 0..%d" % (seq, self._n_seq - 1),
                        "n_past")
        return n

    def _decode(self, t, pos, seq, want):
        """tsr_session_decode of int32 arrays (pos, seq, want may be None)."""
        _check(C.session_decode(self._handle(), t.size, _p32(t),
                                None if pos is None else _p32(pos),
                                None if seq is None else _p32(seq),
                                None if want is None else want.ctypes.data_as(_PTR(ctypes.c_int8))),
               "session_decode")

    def decode(self, tokens, pos=None, seq=None, logits=None):
        """Runs tokens (a list or array of ids) at positions pos (default: each
        sequence continues after its last position) of sequences seq (a list,
        or one id for all; default 0). logits: None = the last token's row
        only (as tsr_session_decode), a list of bools (one per token), or
        True/False for every/no token. Returns a float32 array of shape
        (rows, n_vocab): the rows asked for, in token order."""
        what = "decode"
        t = _int32s(tokens, what, "tokens")
        n = t.size
        pa = sa = wa = None
        if pos is not None:
            pa = _int32s(pos, what, "pos")
            if pa.size != n:
                raise Error(TSR_E_INVALID, "%d positions for %d tokens" % (pa.size, n), what)
        if seq is not None:
            if np.ndim(seq) == 0:
                sa = np.full(n, _int32(seq, what, "seq"), np.int32)
            else:
                sa = _int32s(seq, what, "seq")
                if sa.size != n:
                    raise Error(TSR_E_INVALID, "%d sequence ids for %d tokens" % (sa.size, n),
                                what)
        if logits is None:
            rows = [n - 1] if n else []
        else:
            if logits is True or logits is False:
                want = [bool(logits)] * n
            else:
                try:
                    want = [bool(x) for x in logits]
                except TypeError:
                    raise Error(TSR_E_INVALID, "logits is None, a bool or a list of bools, not %s"
                                % type(logits).__name__, what) from None
            if len(want) != n:
                raise Error(TSR_E_INVALID, "%d logits flags for %d tokens" % (len(want), n), what)
            wa = np.array(want, np.int8)
            rows = [i for i in range(n) if want[i]]
        self._decode(t, pa, sa, wa)
        return self._rows(rows)

    def _rows(self, rows):
        h, nv = self._handle(), self._n_vocab
        out = np.empty((len(rows), nv), np.float32)
        for r, i in enumerate(rows):
            p = C.session_logits(h, i)
            if not p:
                raise Error(TSR_E_STATE, "no logits for token %d of the last decode" % i,
                            "session_logits")
            ctypes.memmove(out[r].ctypes.data, p, nv * 4)
        return out

    def remove(self, seq, p0=0, p1=-1):
        """Forgets positions p0 <= pos < p1 of sequence seq (seq -1: every
        sequence; p1 < 0: to the end)."""
        _check(C.session_remove(self._handle(), _int32(seq, "remove", "seq"),
                                _int32(p0, "remove", "p0"), _int32(p1, "remove", "p1")),
               "session_remove")


class Sampler(_ModelChild):
    """Picks tokens from logits rows (tsr_sampler_*): repetition penalty,
    top-k, top-p, min-p, temperature (0 = greedy), a seeded draw. Made by
    Model.sampler(); closes on exit."""
    _what, _free = "sampler", "sampler_free"

    def __init__(self, model, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=0,
                 repeat_penalty=1.0, repeat_last_n=64):
        if not isinstance(model, Model):
            raise Error(TSR_E_INVALID, "expected a Model, got %s" % type(model).__name__,
                        "sampler")
        p = _init_params(_SamplerParams, C.sampler_params_init)
        try:
            p.temp, p.top_p, p.min_p = float(temperature), float(top_p), float(min_p)
            p.repeat_penalty = float(repeat_penalty)
            p.seed = int(seed) % (1 << 64)
        except (TypeError, ValueError) as e:
            raise Error(TSR_E_INVALID, str(e), "sampler") from None
        p.top_k = _int32(top_k, "sampler", "top_k")
        p.repeat_last_n = _int32(repeat_last_n, "sampler", "repeat_last_n")
        self._own_in(_call_out("sampler_new", C.sampler_new, model._handle(), ctypes.byref(p)),
                     model)
        self._n_vocab = model.n_vocab

    def _sample_at(self, ptr):
        tok = C.sampler_sample(self._handle(), ptr)
        if tok < 0:
            raise Error(TSR_E_INVALID, _s(C.last_error()), "sampler_sample")
        return tok

    def sample(self, logits):
        """A token id from one row of n_vocab logits (a 2-D array: its last
        row); the sampler remembers it for the penalties."""
        a = np.asarray(logits)
        if a.ndim == 2 and a.shape[0] > 0:
            a = a[-1]
        a = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
        if a.size != self._n_vocab:
            raise Error(TSR_E_INVALID, "%d logits, the model has %d tokens"
                        % (a.size, self._n_vocab), "sample")
        return self._sample_at(a.ctypes.data)

    def reset(self):
        """Forgets the remembered tokens and restarts the draws from the seed."""
        C.sampler_reset(self._handle())

    def accept(self, tokens):
        """Remembers tokens (an id or a list of ids, e.g. the prompt) for the
        penalties without drawing."""
        for t in ([tokens] if isinstance(tokens, int) else tokens):
            _check(C.sampler_accept(self._handle(), int(t)), "sampler_accept")


class Model(_Handle):
    """A GGUF model (tsr_model_*) in a backend of its own: the tokenizer, the
    chat template, sessions, samplers and generate().

        m = tsr.Model(path, n_threads=0, n_gpu_layers=0, overrides=None)
        for piece in m.generate("The capital of France is", 16, temperature=0):
            print(piece, end="", flush=True)

    n_gpu_layers and overrides ('regex=BUFT,...', tsr_buft_overrides_parse)
    go to tsr_load_params. vocab_only=True loads the vocabulary and chat
    template alone (tsr_load_params.vocab_only): tokenize, detokenize and
    chat formatting work, session() raises. Closing the model (with, close(), garbage
    collection) frees its sessions and samplers first, then the model, then
    its backend; a session or sampler keeps its model alive."""
    _what, _free = "model", "model_free"
    _cells = None
    _backend = None

    def __init__(self, path, n_threads=0, n_gpu_layers=0, overrides=None, vocab_only=False):
        self._cells = {}
        p = _path(path, "Model")
        self._backend = _ModelBackend(n_threads=n_threads)
        try:
            with _load_params("Model", n_gpu_layers=n_gpu_layers, overrides=overrides,
                              vocab_only=vocab_only) as lp:
                h = _call_out("model_load", C.model_load, self._backend._handle(), p,
                              ctypes.byref(lp))
        except BaseException:
            self.close()
            raise
        self._own(h)
        self._n_vocab = C.model_n_vocab(h)

    def close(self):
        """Frees the model's sessions and samplers, the model, its backend. Idempotent."""
        cells, self._cells = self._cells, None
        for free, cell in (cells or {}).values():
            if cell[0] is not None:
                h, cell[0] = cell[0], None
                getattr(C, free)(h)
        if self._h is not None:
            h, self._h = self._h, None
            C.model_free(h)
        be, self._backend = self._backend, None
        if be is not None:
            be._release()

    def __repr__(self):
        if self._h is None:
            return "Model(<closed>)"
        return "Model(arch=%r, n_vocab=%d, n_ctx_train=%d)" % (self.arch, self.n_vocab,
                                                               self.n_ctx_train)

    @property
    def backend(self):
        """The model's Backend (devices, memory_plan(); closed with the model)."""
        self._handle()
        return self._backend

    arch = _getter("model_arch", _s, "general.architecture ('llama', 'mistral').")
    n_vocab = _getter("model_n_vocab")
    n_ctx_train = _getter("model_n_ctx_train", doc="The context length of the training.")
    bos = _getter("model_token_bos", doc="The BOS token id (-1 when none).")
    eos = _getter("model_token_eos", doc="The EOS token id (-1 when none).")

    def is_eog(self, token):
        """True when token ends a generation (EOS, end of turn, ...)."""
        return bool(C.model_token_is_eog(self._handle(), _int32(token, "is_eog", "token")))

    # -- text ----------------------------------------------------------------
    def tokenize(self, text, add_special=True, parse_special=False):
        """Token ids of text (str, or bytes as they are) as llama.cpp
        tokenizes: add_special adds BOS/EOS as the model asks, parse_special
        turns "<|im_start|>" and the like into their control tokens."""
        h = self._handle()
        if isinstance(text, str):
            try:
                b = text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise Error(TSR_E_INVALID, str(e), "tokenize") from None
        elif isinstance(text, (bytes, bytearray, memoryview)):
            b = bytes(text)
        else:
            raise Error(TSR_E_INVALID, "expected a string, got %s" % type(text).__name__,
                        "tokenize")
        flags = ((TSR_TOKENIZE_ADD_SPECIAL if add_special else 0)
                 | (TSR_TOKENIZE_PARSE_SPECIAL if parse_special else 0))
        cap = len(b) + 8
        while True:
            out = (_I32 * cap)()
            n = _S()
            st = C.model_tokenize(h, b, len(b), flags, out, cap, ctypes.byref(n))
            if st == TSR_E_RANGE and n.value > cap:
                cap = n.value
                continue
            _check(st, "tokenize")
            return list(out[:n.value])

    def token_piece(self, token, special=False):
        """The bytes of one token (control tokens rendered only when special);
        may be part of a UTF-8 character."""
        return _grow("token_piece", C.model_token_piece, self._handle(),
                     _int32(token, "token_piece", "token"), int(bool(special)), cap=32)

    def detokenize(self, ids, special=False):
        """The text of token ids as llama.cpp's detokenizer writes it (control
        tokens rendered when special); invalid UTF-8 becomes U+FFFD."""
        t = _int32s(ids, "detokenize", "ids")
        raw = _grow("detokenize", C.model_detokenize, self._handle(), _p32(t), t.size,
                    int(bool(special)), cap=8 * t.size + 16)
        return raw.decode("utf-8", "replace")

    def chat_format(self, messages, add_assistant=True):
        """messages (dicts {"role", "content"} or (role, content) pairs)
        rendered with the model's chat template; add_assistant opens the
        assistant's turn. Tokenize the result with parse_special=True."""
        h = self._handle()
        what = "chat_format"
        keep = []
        for i, m in enumerate(messages):
            try:
                role, content = (m["role"], m["content"]) if isinstance(m, dict) else m
            except (KeyError, TypeError, ValueError):
                raise Error(TSR_E_INVALID, "message %d: a {'role', 'content'} dict or a (role, "
                            "content) pair, not %r" % (i, m), what) from None
            keep.append((_cstr(role, what), _cstr(content, what)))
        arr = (_ChatMessage * max(1, len(keep)))(*keep)
        raw = _grow(what, C.model_chat_format, h, arr, len(keep), int(bool(add_assistant)),
                    cap=sum(len(r) + len(c) for r, c in keep) + 256)
        return raw.decode("utf-8", "replace")

    # -- sessions, samplers, generation ----------------------------------------
    def session(self, n_ctx=0, n_seq=1, n_batch=0, n_ubatch=0, n_outputs_max=0, type_k=F16,
                type_v=None):
        """A Session of n_ctx KV cells (0: the training context) shared by
        sequences 0..n_seq-1. n_batch (most tokens of one decode, default
        2048), n_ubatch (tokens per graph, default 512) and n_outputs_max (most
        logits rows of one graph, default n_seq) are tsr_session_params'."""
        return Session(self, n_ctx, n_seq, n_batch, n_ubatch, n_outputs_max, type_k, type_v)

    def sampler(self, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=0,
                repeat_penalty=1.0, repeat_last_n=64):
        """A Sampler (temperature 0 = greedy)."""
        return Sampler(self, temperature, top_k, top_p, min_p, seed, repeat_penalty,
                       repeat_last_n)

    def generate(self, prompt, max_tokens=128, temperature=0.8, top_k=40, top_p=0.95,
                 min_p=0.05, seed=0, chat=False):
        """Yields the text of up to max_tokens new tokens as they are produced
        (each piece valid UTF-8: a character split over tokens comes whole),
        stopping early at an end-of-generation token. chat: the prompt is one
        user message (a string), or a conversation (a list of messages as
        chat_format takes them: several turns, a system message), rendered
        with the chat template with the assistant's turn opened. Bad arguments raise
        tsr.Error here, decode failures from the iteration; the session and
        sampler it makes are freed when the iteration ends or the generator
        is closed."""
        what = "generate"
        if chat:
            msgs = [("user", prompt)] if isinstance(prompt, (str, bytes)) else prompt
            ids = self.tokenize(self.chat_format(msgs), True, True)
        else:
            ids = self.tokenize(prompt, True, False)
        if not ids:
            raise Error(TSR_E_INVALID, "the prompt has no tokens", what)
        max_tokens = _int32(max_tokens, what, "max_tokens")
        if max_tokens < 0:
            raise Error(TSR_E_INVALID, "max_tokens %d is negative" % max_tokens, what)
        n = len(ids)
        n_ctx = min(n + max_tokens, max(self.n_ctx_train, n + 1))
        sampler = self.sampler(temperature, top_k, top_p, min_p, seed)
        try:
            session = self.session(n_ctx, 1, n_batch=n)
        except BaseException:
            sampler.close()
            raise
        return self._stream(session, sampler, np.array(ids, np.int32), max_tokens)

    def _stream(self, session, sampler, batch, max_tokens):
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            for _ in range(max_tokens):
                if session.n_past() + batch.size > session.n_ctx:
                    break  # the context is full
                session._decode(batch, None, None, None)
                tok = sampler._sample_at(C.session_logits(session._handle(), batch.size - 1))
                if self.is_eog(tok):
                    break
                text = dec.decode(self.token_piece(tok))
                if text:
                    yield text
                batch = np.array([tok], np.int32)
            text = dec.decode(b"", final=True)
            if text:
                yield text
        finally:
            session.close()
            sampler.close()
