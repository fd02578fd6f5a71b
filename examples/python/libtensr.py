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
import ctypes
import ctypes.util
import os
import weakref

import numpy as np

# The library version this binding was written for: a library with another
# major version has another ABI and is refused.
WRITTEN_FOR = (0, 1, 0)

__all__ = ["Error", "version", "version_info", "devices", "Device", "Buffer", "Backend",
           "Context", "Tensor", "KVCache", "GGUF", "GGUFWriter", "TensorInfo", "type_name",
           "type_by_name", "type_info", "quantize", "dequantize", "set_log_level",
           "get_log_level", "set_log_callback", "backends_available", "last_error",
           "clear_error", "fp32_to_fp16", "fp16_to_fp32", "fp32_to_bf16", "bf16_to_fp32"]

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
_PI64 = ctypes.POINTER(ctypes.c_int64)
_STATUS = ctypes.c_int

_LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, _P, _S, _P)
_PROGRESS_FN = ctypes.CFUNCTYPE(ctypes.c_int, _U64, _U64, _P)


class _BackendParams(ctypes.Structure):
    _fields_ = [("size", _S), ("devices", _P), ("n_threads", _I), ("flash_attn", _I),
                ("attn_max_batch", _S)]


class _BuftOverride(ctypes.Structure):
    _fields_ = [("pattern", _STR), ("buft", _P)]


class _LoadParams(ctypes.Structure):
    _fields_ = [("size", _S), ("n_gpu_layers", _I), ("main_gpu", _I),
                ("tensor_split", ctypes.POINTER(ctypes.c_float)),
                ("overrides", ctypes.POINTER(_BuftOverride)), ("use_mmap", _I),
                ("n_io_threads", _I), ("progress", _PROGRESS_FN), ("progress_user", _P),
                ("verify", _I), ("plan_only", _I)]


class _KVCacheParams(ctypes.Structure):
    _fields_ = [("size", _S), ("n_layers", _I), ("n_ctx", _I64), ("n_head_kv", _I),
                ("head_dim_k", _I), ("head_dim_v", _I), ("type_k", _I), ("type_v", _I),
                ("n_seq", _I), ("n_batch_max", _I64)]


# name: (restype, argtypes). Every function the binding calls is declared;
# a function the loaded library lacks raises tsr.Error when called.
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
    "tsr_type_by_name": (_STATUS, [_STR, ctypes.POINTER(_I)]),
    "tsr_row_size": (_S, [_I, _I64]),
    "tsr_quantize": (_STATUS, [_I, _P, _P, _I64]),
    "tsr_dequantize": (_STATUS, [_I, _P, _P, _I64]),
    "tsr_device_count": (_S, []),
    "tsr_device_get": (_P, [_S]),
    "tsr_device_by_name": (_P, [_STR]),
    "tsr_device_name": (_STR, [_P]),
    "tsr_device_description": (_STR, [_P]),
    "tsr_device_kind": (_I, [_P]),
    "tsr_device_index_in_model": (_I, [_P]),
    "tsr_device_memory": (_STATUS, [_P, ctypes.POINTER(_S), ctypes.POINTER(_S)]),
    "tsr_device_buffer_type": (_P, [_P]),
    "tsr_device_host_buffer_type": (_P, [_P]),
    "tsr_buffer_type_device": (_P, [_P]),
    "tsr_buffer_alloc": (_STATUS, [_P, _S, ctypes.POINTER(_P)]),
    "tsr_buffer_free": (None, [_P]),
    "tsr_buffer_size": (_S, [_P]),
    "tsr_buffer_get_type": (_P, [_P]),
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
    "tsr_buffer_type_name": (_STR, [_P]),
    "tsr_buft_overrides_parse": (_STATUS, [_STR, ctypes.POINTER(ctypes.POINTER(_BuftOverride))]),
    "tsr_buft_overrides_free": (None, [ctypes.POINTER(_BuftOverride)]),
    "tsr_backend_params_init": (None, [ctypes.POINTER(_BackendParams), _S]),
    "tsr_backend_new": (_STATUS, [ctypes.POINTER(_BackendParams), ctypes.POINTER(_P)]),
    "tsr_backend_free": (None, [_P]),
    "tsr_backend_n_devices": (_S, [_P]),
    "tsr_backend_device": (_P, [_P, _S]),
    "tsr_backend_n_threads": (_I, [_P]),
    "tsr_backend_flash_attn": (_I, [_P]),
    "tsr_backend_attn_max_batch": (_S, [_P]),
    "tsr_backend_n_splits": (_S, [_P]),
    "tsr_backend_n_copies": (_S, [_P]),
    "tsr_load_params_init": (None, [ctypes.POINTER(_LoadParams), _S]),
    "tsr_backend_load_gguf": (_STATUS, [_P, _STR, ctypes.POINTER(_LoadParams)]),
    "tsr_backend_declare_weight": (_STATUS, [_P, _STR, _I, _I, _PI64]),
    "tsr_backend_place_weights": (_STATUS, [_P, ctypes.POINTER(_LoadParams)]),
    "tsr_backend_weight": (_T, [_P, _STR]),
    "tsr_backend_n_weights": (_S, [_P]),
    "tsr_backend_weight_at": (_T, [_P, _S]),
    "tsr_backend_n_layers": (_I, [_P]),
    "tsr_backend_weight_on": (_T, [_P, _STR, _P]),
    "tsr_backend_log_plan": (None, [_P]),
    "tsr_backend_layer_buffer_type": (_P, [_P, _I]),
    "tsr_backend_memory_plan": (_STATUS, [_P, _S, ctypes.POINTER(_S), ctypes.POINTER(_S),
                                          ctypes.POINTER(_S)]),
    "tsr_context_new": (_P, [_P]),
    "tsr_context_close": (None, [_P]),
    "tsr_context_error": (_STR, [_P]),
    "tsr_context_status": (_STATUS, [_P]),
    "tsr_context_backend": (_P, [_P]),
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
    "tsr_tensor_nbytes": (_S, [_T]),
    "tsr_tensor_is_contiguous": (_I, [_T]),
    "tsr_tensor_buffer_type": (_P, [_T]),
    "tsr_tensor_device": (_P, [_T]),
    "tsr_tensor_read": (_STATUS, [_T, _P, _S, _S]),
    "tsr_tensor_write": (_STATUS, [_T, _P, _S, _S]),
    "tsr_add": (_T, [_P, _T, _T]),
    "tsr_sub": (_T, [_P, _T, _T]),
    "tsr_mul": (_T, [_P, _T, _T]),
    "tsr_div": (_T, [_P, _T, _T]),
    "tsr_scale": (_T, [_P, _T, _F]),
    "tsr_mul_mat": (_T, [_P, _T, _T]),
    "tsr_get_rows": (_T, [_P, _T, _T]),
    "tsr_set_rows": (_T, [_P, _T, _T, _T]),
    "tsr_rms_norm": (_T, [_P, _T, _F]),
    "tsr_norm": (_T, [_P, _T, _F]),
    "tsr_rope": (_T, [_P, _T, _T, _I, _I, _F, _F]),
    "tsr_rope_ext": (_T, [_P, _T, _T, _T, _I, _I, _I, _F, _F, _F, _F, _F, _F]),
    "tsr_softmax": (_T, [_P, _T]),
    "tsr_softmax_ext": (_T, [_P, _T, _T, _F]),
    "tsr_silu": (_T, [_P, _T]),
    "tsr_gelu": (_T, [_P, _T]),
    "tsr_swiglu": (_T, [_P, _T, _T]),
    "tsr_geglu": (_T, [_P, _T, _T]),
    "tsr_concat": (_T, [_P, _T, _T, _I]),
    "tsr_argmax": (_T, [_P, _T]),
    "tsr_cpy": (_T, [_P, _T, _T]),
    "tsr_cont": (_T, [_P, _T]),
    "tsr_cast": (_T, [_P, _T, _I]),
    "tsr_view_1d": (_T, [_P, _T, _I64, _S]),
    "tsr_view_2d": (_T, [_P, _T, _I64, _I64, _S, _S]),
    "tsr_view_3d": (_T, [_P, _T, _I64, _I64, _I64, _S, _S, _S]),
    "tsr_view_4d": (_T, [_P, _T, _I64, _I64, _I64, _I64, _S, _S, _S, _S]),
    "tsr_reshape": (_T, [_P, _T, _I, _PI64]),
    "tsr_permute": (_T, [_P, _T, _I, _I, _I, _I]),
    "tsr_transpose": (_T, [_P, _T]),
    "tsr_flash_attn": (_T, [_P, _T, _T, _T, _T, _F]),
    "tsr_compute": (_STATUS, [_P, ctypes.POINTER(_T), _S]),
    "tsr_reserve": (_STATUS, [_P, ctypes.POINTER(_T), _S]),
    "tsr_measure": (_STATUS, [_P, ctypes.POINTER(_T), _S, ctypes.POINTER(_S)]),
    "tsr_kv_cache_params_init": (None, [ctypes.POINTER(_KVCacheParams), _S]),
    "tsr_kv_cache_new": (_STATUS, [_P, ctypes.POINTER(_KVCacheParams), ctypes.POINTER(_P)]),
    "tsr_kv_cache_free": (None, [_P]),
    "tsr_kv_cache_begin": (_STATUS, [_P, _P, _I64, ctypes.POINTER(ctypes.c_int32),
                                     ctypes.POINTER(ctypes.c_int32)]),
    "tsr_kv_cache_clear": (None, [_P]),
    "tsr_kv_cache_remove": (_STATUS, [_P, _I, ctypes.c_int32, ctypes.c_int32]),
    "tsr_kv_cache_used": (_I64, [_P]),
    "tsr_kv_cache_n_ctx": (_I64, [_P]),
    "tsr_kv_cache_mask": (_T, [_P]),
    "tsr_kv_cache_begin_reserve": (_STATUS, [_P, _P, _I64]),
    "tsr_attention": (_T, [_P, _P, _I, _T, _T, _T, _F]),
    "tsr_attention_nocache": (_T, [_P, _T, _T, _T, _T, _F]),
    "tsr_gguf_open": (_STATUS, [_STR, ctypes.POINTER(_P)]),
    "tsr_gguf_open_memory": (_STATUS, [_P, _S, _STR, _I, ctypes.POINTER(_P)]),
    "tsr_gguf_data_offset": (_U64, [_P]),
    "tsr_gguf_path": (_STR, [_P]),
    "tsr_gguf_get_u32": (_STATUS, [_P, _STR, ctypes.POINTER(_U32)]),
    "tsr_gguf_get_i32": (_STATUS, [_P, _STR, ctypes.POINTER(ctypes.c_int32)]),
    "tsr_gguf_get_f32": (_STATUS, [_P, _STR, ctypes.POINTER(ctypes.c_float)]),
    "tsr_gguf_get_raw": (_STATUS, [_P, _I64, ctypes.POINTER(_P), ctypes.POINTER(_S)]),
    "tsr_gguf_close": (None, [_P]),
    "tsr_gguf_version": (_U32, [_P]),
    "tsr_gguf_n_tensors": (_I64, [_P]),
    "tsr_gguf_n_keys": (_I64, [_P]),
    "tsr_gguf_alignment": (_S, [_P]),
    "tsr_gguf_find_key": (_I64, [_P, _STR]),
    "tsr_gguf_key_name": (_STR, [_P, _I64]),
    "tsr_gguf_key_type": (_I, [_P, _I64]),
    "tsr_gguf_get_i64": (_STATUS, [_P, _STR, ctypes.POINTER(_I64)]),
    "tsr_gguf_get_u64": (_STATUS, [_P, _STR, ctypes.POINTER(_U64)]),
    "tsr_gguf_get_f64": (_STATUS, [_P, _STR, ctypes.POINTER(ctypes.c_double)]),
    "tsr_gguf_get_bool": (_STATUS, [_P, _STR, ctypes.POINTER(_I)]),
    "tsr_gguf_get_str": (_STATUS, [_P, _STR, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_S)]),
    "tsr_gguf_get_arr_info": (_STATUS, [_P, _STR, ctypes.POINTER(_I), ctypes.POINTER(_U64)]),
    "tsr_gguf_get_arr_data": (_STATUS, [_P, _STR, ctypes.POINTER(_P)]),
    "tsr_gguf_get_arr_str": (_STATUS, [_P, _STR, _U64, ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.POINTER(_S)]),
    "tsr_gguf_find_tensor": (_I64, [_P, _STR]),
    "tsr_gguf_tensor_name": (_STR, [_P, _I64]),
    "tsr_gguf_tensor_type": (_I, [_P, _I64]),
    "tsr_gguf_tensor_n_dims": (_I, [_P, _I64]),
    "tsr_gguf_tensor_ne": (_I64, [_P, _I64, _I]),
    "tsr_gguf_tensor_offset": (_U64, [_P, _I64]),
    "tsr_gguf_tensor_size": (_S, [_P, _I64]),
    "tsr_gguf_read_tensor": (_STATUS, [_P, _I64, _P, _S]),
    "tsr_gguf_writer_new": (_STATUS, [ctypes.POINTER(_P)]),
    "tsr_gguf_writer_free": (None, [_P]),
    "tsr_gguf_writer_set_alignment": (_STATUS, [_P, _S]),
    "tsr_gguf_writer_set": (_STATUS, [_P, _STR, _I, _P]),
    "tsr_gguf_writer_set_str": (_STATUS, [_P, _STR, _STR]),
    "tsr_gguf_writer_set_arr": (_STATUS, [_P, _STR, _I, _P, _U64]),
    "tsr_gguf_writer_set_arr_str": (_STATUS, [_P, _STR, ctypes.POINTER(_STR), _U64]),
    "tsr_gguf_writer_add_tensor": (_STATUS, [_P, _STR, _I, _I, _PI64, _P]),
    "tsr_gguf_writer_write_file": (_STATUS, [_P, _STR]),
    "tsr_gguf_writer_copy_keys": (_STATUS, [_P, _P]),
    "tsr_gguf_writer_write_memory": (_STATUS, [_P, ctypes.POINTER(_P), ctypes.POINTER(_S)]),
}


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
    n = C.type_name(int(t))
    return _s(n)


def type_by_name(name):
    out = _I()
    _check(C.type_by_name(_cstr(name, "type_by_name"), ctypes.byref(out)), "type_by_name")
    return out.value


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
            arr = ctypes.cast(fields, ctypes.POINTER(_Field))
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
        free, total = _S(), _S()
        _check(C.device_memory(handle, ctypes.byref(free), ctypes.byref(total)), "device_memory")
        self.free, self.total = free.value, total.value
        self.index_in_model = C.device_index_in_model(handle)
        bt, hbt = C.device_buffer_type(handle), C.device_host_buffer_type(handle)
        self.buffer_type = _s(C.buffer_type_name(bt)) if bt else None
        self.host_buffer_type = _s(C.buffer_type_name(hbt)) if hbt else None

    def __repr__(self):
        return "Device(%r, %r, free=%d, total=%d)" % (self.name, self.description, self.free,
                                                       self.total)


def devices():
    """Every device: GPUs in driver order, then the CPU."""
    return [Device(C.device_get(i)) for i in range(C.device_count())]


def _buft(name, what):
    bt = C.buffer_type_by_name(_cstr(name, what))
    if not bt:
        raise Error(TSR_E_NOT_FOUND, _s(C.last_error()) or "no buffer type %r" % name, what)
    return bt


class Buffer:
    """Raw memory of a buffer type ('CPU', 'CUDA0', 'CUDA_Host'); closes on exit."""

    def __init__(self, buffer_type, size):
        out = _P()
        self._h = None
        _check(C.buffer_alloc(_buft(buffer_type, "buffer_alloc"), int(size), ctypes.byref(out)),
               "buffer_alloc")
        self._h = out.value

    def _handle(self):
        if self._h is None:
            raise Error(TSR_E_STATE, "the buffer is freed")
        return self._h

    @property
    def size(self):
        return C.buffer_size(self._handle())

    @property
    def buffer_type(self):
        return _s(C.buffer_type_name(C.buffer_get_type(self._handle())))

    @property
    def device(self):
        d = C.buffer_type_device(C.buffer_get_type(self._handle()))
        return Device(d) if d else None

    def close(self):
        if self._h is not None:
            C.buffer_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

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
    def ndim(self):
        return max(self._ndim, C.tensor_n_dims(self._handle()))

    @property
    def shape(self):
        return tuple(reversed(self.ne[:self.ndim]))

    @property
    def type(self):
        return C.tensor_type(self._handle())

    @property
    def type_name(self):
        return type_name(self.type)

    @property
    def name(self):
        return _s(C.tensor_name(self._handle()))

    @name.setter
    def name(self, value):
        C.set_name(self._handle(), _cstr(value, "set_name"))

    @property
    def nbytes(self):
        return C.tensor_nbytes(self._handle())

    @property
    def nb(self):
        h = self._handle()
        return [C.tensor_nb(h, i) for i in range(4)]

    @property
    def is_contiguous(self):
        return bool(C.tensor_is_contiguous(self._handle()))

    @property
    def buffer_type(self):
        """Name of the buffer type holding the data (None when not allocated)."""
        bt = C.tensor_buffer_type(self._handle())
        return _s(C.buffer_type_name(bt)) if bt else None

    @property
    def device(self):
        """Name of the device that ran this node in the last compute (or None)."""
        d = C.tensor_device(self._handle())
        return _s(C.device_name(d)) if d else None

    def numpy(self):
        """Copies the tensor's contents out: a numpy array of .shape (quantized
        and BF16 tensors come out as float32)."""
        h = self._handle()
        t, n, size = C.tensor_type(h), C.tensor_nelements(h), C.tensor_nbytes(h)
        if t in _NP_OF_TYPE:
            out = np.empty(self.shape, _NP_OF_TYPE[t])
            if size:
                _check(C.tensor_read(h, out.ctypes.data, 0, size), "tensor_read")
            return out
        raw = ctypes.create_string_buffer(max(size, 1))
        if size:
            _check(C.tensor_read(h, raw, 0, size), "tensor_read")
        out = np.empty(self.shape, np.float32)
        if n:
            _check(C.dequantize(t, raw, out.ctypes.data, n), "dequantize")
        return out

    def write(self, array):
        """Copies a numpy array in (same number of elements; converted to the
        tensor's type, quantizing if needed), or `bytes` as they are."""
        h = self._handle()
        t = C.tensor_type(h)
        if isinstance(array, (bytes, bytearray, memoryview)):
            x = np.frombuffer(bytes(array), np.uint8)
            data = x.ctypes.data
        elif t in _NP_OF_TYPE:
            x = np.ascontiguousarray(array, dtype=_NP_OF_TYPE[t])
            data = x.ctypes.data
        else:
            x = np.frombuffer(quantize(array, t), np.uint8)
            data = x.ctypes.data
        if x.nbytes != C.tensor_nbytes(h):
            raise Error(TSR_E_INVALID, "%d bytes given for a tensor of %d bytes (shape %s)"
                        % (x.nbytes, C.tensor_nbytes(h), self.shape), "tensor_write")
        if x.nbytes:
            _check(C.tensor_write(h, data, 0, x.nbytes), "tensor_write")

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


class Context:
    """An arena for one forward pass: inputs, ops, compute; closes on exit."""

    def __init__(self, backend):
        self._backend = backend
        h = C.context_new(backend._handle())
        if not h:
            raise Error(TSR_E_NOMEM, _s(C.last_error()), "context_new")
        self._h = h
        backend._children.add(self)

    def _closed(self):
        return self._h is None

    def _handle(self):
        if self._h is None:
            raise Error(TSR_E_STATE, "the context is closed")
        return self._h

    def close(self):
        """Frees everything allocated through the context. Idempotent."""
        if self._h is not None:
            C.context_close(self._h)
            self._h = None
            self._backend._children.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def backend(self):
        return self._backend

    @property
    def error(self):
        """The first op error recorded in the context, or None."""
        return _s(C.context_error(self._handle()))

    def _wrap(self, h, ndim, what):
        if not h:
            ctxh = self._handle()
            st = C.context_status(ctxh)
            raise Error(st if st != TSR_OK else TSR_E_INVALID,
                        _s(C.context_error(ctxh)) or _s(C.last_error()), what)
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
        if type is None:
            dt = np.dtype(np.float32) if array.dtype == np.float64 else array.dtype
            if dt == np.bool_:
                raise Error(TSR_E_TYPE, "bool arrays have no libtensr type", "input")
            if dt not in _TYPE_OF_NP:
                raise Error(TSR_E_TYPE, "numpy dtype %s has no libtensr type" % dt, "input")
            t = _TYPE_OF_NP[dt]
        else:
            t = _to_type(type)
        if t in _NP_OF_TYPE:
            try:
                x = np.ascontiguousarray(array, dtype=_NP_OF_TYPE[t])
            except (TypeError, ValueError) as e:
                raise Error(TSR_E_TYPE, "cannot convert %s to %s: %s"
                            % (array.dtype, type_name(t), e), "input")
            buf = x.ctypes.data
        else:
            x = np.frombuffer(quantize(array, t), np.uint8) if array.size else np.zeros(1, np.uint8)
            buf = x.ctypes.data
        ne = _ne_array(reversed(shape))
        return self._wrap(C.input(h, t, len(shape), ne, buf), len(shape), "input")

    def new_tensor(self, shape, type=F32, buffer_type=None):
        """A zero-filled tensor allocated now (numpy-order shape)."""
        bt = _buft(buffer_type, "new_tensor") if buffer_type is not None else None
        shape = tuple(shape)
        return self._wrap(C.new_tensor(self._handle(), bt, _to_type(type), len(shape),
                                       _ne_array(reversed(shape))), len(shape), "new_tensor")

    def empty(self, shape, type=F32):
        shape = tuple(shape)
        return self._wrap(C.empty(self._handle(), _to_type(type), len(shape),
                                  _ne_array(reversed(shape))), len(shape), "empty")

    # -- ops -----------------------------------------------------------------
    def _op(self, name, args, ndim, *extra):
        h = self._handle()
        ts = [_as_tensor(a, self, name) for a in args]
        hs = [t._h if t is not None else None for t in ts]
        if ndim is None:
            ndim = max([t._ndim for t in ts if t is not None] or [1])
        return self._wrap(getattr(C, name)(h, *hs, *extra), ndim, name)

    def add(self, a, b):
        return self._op("add", (a, b), None)

    def sub(self, a, b):
        return self._op("sub", (a, b), None)

    def mul(self, a, b):
        return self._op("mul", (a, b), None)

    def div(self, a, b):
        return self._op("div", (a, b), None)

    def scale(self, a, s):
        return self._op("scale", (a,), None, float(s))

    def mul_mat(self, a, b):
        """a [k, m] x b [k, n] -> [m, n]: result[j][i] = sum_k a[i][k] b[j][k];
        in numpy terms c.numpy() == b @ a.T."""
        return self._op("mul_mat", (a, b), None)

    def get_rows(self, a, idx):
        return self._op("get_rows", (a, idx), None)

    def set_rows(self, dst, src, idx):
        return self._op("set_rows", (dst, src, idx), None)

    def rms_norm(self, a, eps=1e-5):
        return self._op("rms_norm", (a,), None, float(eps))

    def norm(self, a, eps=1e-5):
        return self._op("norm", (a,), None, float(eps))

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

    def silu(self, a):
        return self._op("silu", (a,), None)

    def gelu(self, a):
        return self._op("gelu", (a,), None)

    def swiglu(self, a, b):
        return self._op("swiglu", (a, b), None)

    def geglu(self, a, b):
        return self._op("geglu", (a, b), None)

    def concat(self, a, b, dim):
        """dim in libtensr's numbering (0 = innermost = numpy's last axis)."""
        return self._op("concat", (a, b), None, int(dim))

    def argmax(self, a):
        t = _as_tensor(a, self, "argmax")
        return self._op("argmax", (t,), max(1, t._ndim - 1))

    def cpy(self, a, b):
        return self._op("cpy", (a, b), _as_tensor(b, self, "cpy")._ndim)

    def cont(self, a):
        return self._op("cont", (a,), None)

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
        return self._op("reshape", (a,), len(shape), len(shape), _ne_array(reversed(shape)))

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
    def _outs(self, outs, what):
        if len(outs) == 1 and isinstance(outs[0], (list, tuple)):
            outs = outs[0]
        if not outs:
            raise Error(TSR_E_INVALID, "no outputs given", what)
        ts = [_as_tensor(t, self, what) for t in outs]
        return (_T * len(ts))(*[t._h for t in ts]), len(ts)

    def compute(self, *outs):
        """Runs the graph that produces the outputs (one or several tensors, or a list)."""
        h = self._handle()
        arr, n = self._outs(outs, "compute")
        st = C.compute(h, arr, n)
        if st != TSR_OK:
            raise Error(st, _s(C.context_error(h)) or _s(C.last_error()), "compute")

    def reserve(self, *outs):
        h = self._handle()
        arr, n = self._outs(outs, "reserve")
        _check(C.reserve(h, arr, n), "reserve")

    def measure(self, *outs):
        """Peak compute bytes per backend device for this graph."""
        h = self._handle()
        arr, n = self._outs(outs, "measure")
        sizes = (_S * max(1, C.backend_n_devices(self._backend._handle())))()
        _check(C.measure(h, arr, n, sizes), "measure")
        return list(sizes)


# ---------------------------------------------------------------------------
# Backend, weights, KV cache
# ---------------------------------------------------------------------------


class Backend:
    """The engine: devices in use, one scheduler, the weights. Closes on exit
    (closing its contexts and KV caches first)."""

    def __init__(self, n_threads=0, devices=None, flash_attn="auto", attn_max_batch=0):
        p = _BackendParams()
        C.backend_params_init(ctypes.byref(p), ctypes.sizeof(p))
        p.n_threads = int(n_threads)
        if flash_attn not in _FLASH:
            raise Error(TSR_E_INVALID, "flash_attn is 'auto', 'on' or 'off', not %r"
                        % (flash_attn,), "Backend")
        p.flash_attn = _FLASH[flash_attn]
        p.attn_max_batch = int(attn_max_batch)
        self._devs = None
        if devices is not None:
            hs = []
            for d in devices:
                h = d._h if isinstance(d, Device) else C.device_by_name(_cstr(d, "Backend"))
                if not h:
                    raise Error(TSR_E_NOT_FOUND, _s(C.last_error()) or "no device %r" % d,
                                "Backend")
                hs.append(h)
            self._devs = (_P * (len(hs) + 1))(*hs, None)
            p.devices = ctypes.cast(self._devs, _P)
        out = _P()
        self._h = None
        self._children = weakref.WeakSet()
        _check(C.backend_new(ctypes.byref(p), ctypes.byref(out)), "backend_new")
        self._h = out.value

    def _closed(self):
        return self._h is None

    def _handle(self):
        if self._h is None:
            raise Error(TSR_E_STATE, "the backend is closed")
        return self._h

    def close(self):
        if self._h is not None:
            for c in list(self._children):
                c.close()
            C.backend_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def context(self):
        return Context(self)

    @property
    def n_threads(self):
        return C.backend_n_threads(self._handle())

    @property
    def flash_attn(self):
        return bool(C.backend_flash_attn(self._handle()))

    @property
    def devices(self):
        h = self._handle()
        return [Device(C.backend_device(h, i)) for i in range(C.backend_n_devices(h))]

    def load(self, path, n_gpu_layers=0, main_gpu=0, tensor_split=None, overrides=None,
             use_mmap=False, n_io_threads=0, progress=None, verify=False):
        """Loads a GGUF file's tensors as weights. overrides: 'regex=BUFT,...';
        progress(done, total) -> True to cancel."""
        p = _LoadParams()
        C.load_params_init(ctypes.byref(p), ctypes.sizeof(p))
        p.n_gpu_layers, p.main_gpu = int(n_gpu_layers), int(main_gpu)
        p.use_mmap, p.n_io_threads, p.verify = int(bool(use_mmap)), int(n_io_threads), int(verify)
        keep = []
        if tensor_split is not None:
            arr = (ctypes.c_float * len(tensor_split))(*tensor_split)
            keep.append(arr)
            p.tensor_split = arr
        ov = ctypes.POINTER(_BuftOverride)()
        if overrides:
            _check(C.buft_overrides_parse(_cstr(overrides, "load"), ctypes.byref(ov)), "overrides")
            p.overrides = ov
        if progress is not None:
            def tramp(done, total, _u):
                try:
                    return 1 if progress(done, total) else 0
                except Exception:
                    return 1
            cb = _PROGRESS_FN(tramp)
            keep.append(cb)
            p.progress = cb
        try:
            _check(C.backend_load_gguf(self._handle(), _cstr(os.fspath(path), "load"),
                                       ctypes.byref(p)), "load_gguf")
        finally:
            if ov:
                C.buft_overrides_free(ov)

    def declare_weight(self, name, shape, type=F32):
        shape = tuple(shape)
        _check(C.backend_declare_weight(self._handle(), _cstr(name, "declare_weight"),
                                        _to_type(type), len(shape), _ne_array(reversed(shape))),
               "declare_weight")

    def place_weights(self):
        p = _LoadParams()
        C.load_params_init(ctypes.byref(p), ctypes.sizeof(p))
        _check(C.backend_place_weights(self._handle(), ctypes.byref(p)), "place_weights")

    def weight(self, name):
        h = C.backend_weight(self._handle(), _cstr(name, "weight"))
        if not h:
            raise Error(TSR_E_NOT_FOUND, _s(C.last_error()) or "no weight %r" % name, "weight")
        return Tensor(self, h, C.tensor_n_dims(h))

    def weight_names(self):
        h = self._handle()
        return [_s(C.tensor_name(C.backend_weight_at(h, i))) for i in range(C.backend_n_weights(h))]

    @property
    def n_layers(self):
        return C.backend_n_layers(self._handle())

    @property
    def attn_max_batch(self):
        return C.backend_attn_max_batch(self._handle())

    @property
    def n_splits(self):
        """Splits of the last compute/reserve."""
        return C.backend_n_splits(self._handle())

    @property
    def n_copies(self):
        return C.backend_n_copies(self._handle())

    def weight_on(self, name, device):
        d = device._h if isinstance(device, Device) else C.device_by_name(_cstr(device, "weight_on"))
        h = C.backend_weight_on(self._handle(), _cstr(name, "weight_on"), d)
        if not h:
            raise Error(TSR_E_NOT_FOUND, _s(C.last_error()) or "no weight %r" % name, "weight_on")
        return Tensor(self, h, C.tensor_n_dims(h))

    def layer_buffer_type(self, il):
        bt = C.backend_layer_buffer_type(self._handle(), int(il))
        return _s(C.buffer_type_name(bt)) if bt else None

    def memory_plan(self):
        """Per device of the backend: {'device', 'weights', 'kv_cache', 'compute'} bytes."""
        h = self._handle()
        out = []
        for i in range(C.backend_n_devices(h)):
            w, kv, c = _S(), _S(), _S()
            _check(C.backend_memory_plan(h, i, ctypes.byref(w), ctypes.byref(kv), ctypes.byref(c)),
                   "memory_plan")
            out.append({"device": _s(C.device_name(C.backend_device(h, i))), "weights": w.value,
                        "kv_cache": kv.value, "compute": c.value})
        return out

    def log_plan(self):
        C.backend_log_plan(self._handle())

    def kv_cache(self, n_layers, n_ctx, n_head_kv, head_dim_k, head_dim_v=None, type_k=F16,
                 type_v=None, n_seq=1, n_batch_max=512):
        return KVCache(self, n_layers, n_ctx, n_head_kv, head_dim_k,
                       head_dim_k if head_dim_v is None else head_dim_v, type_k,
                       type_k if type_v is None else type_v, n_seq, n_batch_max)


class KVCache:
    """Per-layer K/V of past tokens (see tsr_kv_cache_new(3))."""

    def __init__(self, backend, n_layers, n_ctx, n_head_kv, head_dim_k, head_dim_v, type_k,
                 type_v, n_seq, n_batch_max):
        p = _KVCacheParams()
        C.kv_cache_params_init(ctypes.byref(p), ctypes.sizeof(p))
        p.n_layers, p.n_ctx, p.n_head_kv = int(n_layers), int(n_ctx), int(n_head_kv)
        p.head_dim_k, p.head_dim_v = int(head_dim_k), int(head_dim_v)
        p.type_k, p.type_v = _to_type(type_k), _to_type(type_v)
        p.n_seq, p.n_batch_max = int(n_seq), int(n_batch_max)
        out = _P()
        self._h = None
        self._backend = backend
        _check(C.kv_cache_new(backend._handle(), ctypes.byref(p), ctypes.byref(out)),
               "kv_cache_new")
        self._h = out.value
        backend._children.add(self)

    def _closed(self):
        return self._h is None

    def _handle(self):
        if self._h is None:
            raise Error(TSR_E_STATE, "the KV cache is closed")
        return self._h

    def close(self):
        if self._h is not None:
            C.kv_cache_free(self._h)
            self._h = None
            self._backend._children.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def begin(self, ctx, pos, seq=None):
        """Starts a batch at positions pos (sequence ids seq) in context ctx."""
        pos = np.ascontiguousarray(pos, dtype=np.int32).reshape(-1)
        sp = None
        if seq is not None:
            seq = np.ascontiguousarray(seq, dtype=np.int32).reshape(-1)
            if seq.size != pos.size:
                raise Error(TSR_E_INVALID, "seq and pos differ in length", "kv_cache_begin")
            sp = seq.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        _check(C.kv_cache_begin(self._handle(), ctx._handle(), pos.size,
                                pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), sp),
               "kv_cache_begin")

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

    @property
    def used(self):
        return C.kv_cache_used(self._handle())

    @property
    def n_ctx(self):
        return C.kv_cache_n_ctx(self._handle())


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


class GGUF:
    """A GGUF file's metadata: g.keys(), g[key] / g.get(key), g.tensors(),
    g.read_tensor(name). Closes on exit."""

    def __init__(self, path=None, data=None, name=None):
        out = _P()
        self._h = None
        if data is not None:  # from memory (copied by the library)
            buf = bytes(data)
            _check(C.gguf_open_memory(buf, len(buf), _cstr(name or "<memory>", "gguf_open"), 0,
                                      ctypes.byref(out)), "gguf_open_memory")
        else:
            _check(C.gguf_open(_cstr(os.fspath(path), "gguf_open"), ctypes.byref(out)), "gguf_open")
        self._h = out.value

    @classmethod
    def from_bytes(cls, data, name=None):
        return cls(data=data, name=name)

    @property
    def alignment(self):
        return C.gguf_alignment(self._handle())

    @property
    def data_offset(self):
        return C.gguf_data_offset(self._handle())

    @property
    def path(self):
        return _s(C.gguf_path(self._handle()))

    def raw(self, key):
        """The bytes of a scalar key's value as stored in the file."""
        h = self._handle()
        i = C.gguf_find_key(h, _cstr(key, "gguf_raw"))
        if i < 0:
            raise KeyError(key)
        p, n = _P(), _S()
        _check(C.gguf_get_raw(h, i, ctypes.byref(p), ctypes.byref(n)), key)
        return ctypes.string_at(p, n.value)

    def _handle(self):
        if self._h is None:
            raise Error(TSR_E_STATE, "the GGUF file is closed")
        return self._h

    def close(self):
        if self._h is not None:
            C.gguf_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def version(self):
        return C.gguf_version(self._handle())

    def keys(self):
        h = self._handle()
        return [_s(C.gguf_key_name(h, i)) for i in range(C.gguf_n_keys(h))]

    def __contains__(self, key):
        return C.gguf_find_key(self._handle(), _cstr(key, "gguf")) >= 0

    def __getitem__(self, key):
        h = self._handle()
        k = _cstr(key, "gguf_get")
        i = C.gguf_find_key(h, k)
        if i < 0:
            raise KeyError(key)
        t = C.gguf_key_type(h, i)
        if t == _G_STR:
            return self._str(k)
        if t == _G_ARR:
            return self._array(k)
        if t == _G_BOOL:
            v = _I()
            _check(C.gguf_get_bool(h, k, ctypes.byref(v)), key)
            return bool(v.value)
        if t == _G_F32:
            v = ctypes.c_float()
            _check(C.gguf_get_f32(h, k, ctypes.byref(v)), key)
            return v.value
        if t == _G_F64:
            v = ctypes.c_double()
            _check(C.gguf_get_f64(h, k, ctypes.byref(v)), key)
            return v.value
        if t == _G_U64:
            v = _U64()
            _check(C.gguf_get_u64(h, k, ctypes.byref(v)), key)
            return v.value
        if t == _G_U32:
            v = _U32()
            _check(C.gguf_get_u32(h, k, ctypes.byref(v)), key)
            return v.value
        if t in (_G_U8, _G_I8, _G_U16, _G_I16, _G_I32):
            v = ctypes.c_int32()
            _check(C.gguf_get_i32(h, k, ctypes.byref(v)), key)
            return v.value
        v = _I64()
        _check(C.gguf_get_i64(h, k, ctypes.byref(v)), key)
        return v.value

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def _str(self, k):
        p, n = ctypes.c_void_p(), _S()
        _check(C.gguf_get_str(self._h, k, ctypes.byref(p), ctypes.byref(n)), _s(k))
        return ctypes.string_at(p, n.value).decode("utf-8", "replace")

    def _array(self, k):
        h = self._h
        et, n = _I(), _U64()
        _check(C.gguf_get_arr_info(h, k, ctypes.byref(et), ctypes.byref(n)), _s(k))
        if et.value == _G_STR:
            out = []
            p, ln = ctypes.c_void_p(), _S()
            for i in range(n.value):
                _check(C.gguf_get_arr_str(h, k, i, ctypes.byref(p), ctypes.byref(ln)), _s(k))
                out.append(ctypes.string_at(p, ln.value).decode("utf-8", "replace"))
            return out
        if et.value not in _G_NP:
            raise Error(TSR_E_UNSUPPORTED, "array of type %d" % et.value, _s(k))
        dt = np.dtype(_G_NP[et.value])
        if n.value == 0:
            return np.empty(0, dt)
        p = _P()
        _check(C.gguf_get_arr_data(h, k, ctypes.byref(p)), _s(k))
        arr = np.frombuffer(ctypes.string_at(p, n.value * dt.itemsize), dtype=dt.newbyteorder("<"))
        return arr.astype(bool) if et.value == _G_BOOL else arr.astype(dt)

    def tensors(self):
        h = self._handle()
        out = []
        for i in range(C.gguf_n_tensors(h)):
            nd = C.gguf_tensor_n_dims(h, i)
            out.append(TensorInfo(_s(C.gguf_tensor_name(h, i)), C.gguf_tensor_type(h, i),
                                  [C.gguf_tensor_ne(h, i, d) for d in range(nd)],
                                  C.gguf_tensor_offset(h, i), C.gguf_tensor_size(h, i)))
        return out

    def read_tensor(self, name, raw=False):
        """A tensor's data as numpy (quantized types dequantized to float32),
        or its bytes as stored when raw is true."""
        h = self._handle()
        i = C.gguf_find_tensor(h, _cstr(name, "read_tensor"))
        if i < 0:
            raise Error(TSR_E_NOT_FOUND, "no tensor %r" % name, "read_tensor")
        t, size = C.gguf_tensor_type(h, i), C.gguf_tensor_size(h, i)
        nd = C.gguf_tensor_n_dims(h, i)
        shape = tuple(reversed([C.gguf_tensor_ne(h, i, d) for d in range(nd)]))
        buf = ctypes.create_string_buffer(max(size, 1))
        _check(C.gguf_read_tensor(h, i, buf, size), "read_tensor")
        if raw:
            return buf.raw[:size]
        if t in _NP_OF_TYPE:
            return np.frombuffer(buf.raw[:size], _NP_OF_TYPE[t]).reshape(shape).copy()
        return dequantize(buf.raw[:size], t, int(np.prod(shape))).reshape(shape)


class GGUFWriter:
    """Collects keys and tensors; write(path)."""

    def __init__(self):
        out = _P()
        self._h = None
        _check(C.gguf_writer_new(ctypes.byref(out)), "gguf_writer_new")
        self._h = out.value

    def _handle(self):
        if self._h is None:
            raise Error(TSR_E_STATE, "the writer is closed")
        return self._h

    def close(self):
        if self._h is not None:
            C.gguf_writer_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def set(self, key, value):
        """str, bool, int (INT64), float (FLOAT32), list of str, or numpy array."""
        h, k = self._handle(), _cstr(key, "gguf_writer_set")
        if isinstance(value, str):
            _check(C.gguf_writer_set_str(h, k, _cstr(value, key)), key)
        elif isinstance(value, bool):
            v = ctypes.c_uint8(value)
            _check(C.gguf_writer_set(h, k, _G_BOOL, ctypes.byref(v)), key)
        elif isinstance(value, int):
            v = _I64(value)
            _check(C.gguf_writer_set(h, k, _G_I64, ctypes.byref(v)), key)
        elif isinstance(value, float):
            v = ctypes.c_float(value)
            _check(C.gguf_writer_set(h, k, _G_F32, ctypes.byref(v)), key)
        elif isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value):
            arr = (_STR * max(1, len(value)))(*[_cstr(x, key) for x in value])
            _check(C.gguf_writer_set_arr_str(h, k, arr, len(value)), key)
        else:
            a = np.ascontiguousarray(value)
            rev = {np.dtype(v): t for t, v in _G_NP.items() if t != _G_BOOL}
            if a.dtype not in rev:
                raise Error(TSR_E_TYPE, "cannot store %s in GGUF" % a.dtype, key)
            _check(C.gguf_writer_set_arr(h, k, rev[a.dtype], a.ctypes.data, a.size), key)

    def add_tensor(self, name, array, type=None):
        a = np.asarray(array)
        if a.ndim == 0 or a.ndim > 4:
            raise Error(TSR_E_INVALID, "1 to 4 dimensions, got %d" % a.ndim, "add_tensor")
        t = _to_type(type if type is not None else
                     (np.float32 if a.dtype == np.float64 else a.dtype))
        if t in _NP_OF_TYPE:
            x = np.ascontiguousarray(a, dtype=_NP_OF_TYPE[t])
        else:
            x = np.frombuffer(quantize(a, t), np.uint8)
        _check(C.gguf_writer_add_tensor(self._handle(), _cstr(name, "add_tensor"), t, a.ndim,
                                        _ne_array(reversed(a.shape)), x.ctypes.data), name)

    def set_alignment(self, alignment):
        _check(C.gguf_writer_set_alignment(self._handle(), int(alignment)), "set_alignment")

    def copy_keys(self, gguf):
        """Copies every key of an open GGUF (except general.alignment)."""
        _check(C.gguf_writer_copy_keys(self._handle(), gguf._handle()), "copy_keys")

    def write(self, path):
        _check(C.gguf_writer_write_file(self._handle(), _cstr(os.fspath(path), "write")),
               "gguf_write")

    def to_bytes(self):
        p, n = _P(), _S()
        _check(C.gguf_writer_write_memory(self._handle(), ctypes.byref(p), ctypes.byref(n)),
               "gguf_write_memory")
        try:
            return ctypes.string_at(p, n.value)
        finally:
            C.free(p)
