"""Hand-made DLPack producers, for element types numpy lacks (bfloat16,
float8) and for the flags numpy never sets (read-only, strides).

DLTensor(storage, code, bits) exposes `storage` (a numpy array, which owns
the bytes) through __dlpack__ as a capsule built with ctypes, in the legacy
("dltensor") or the versioned ("dltensor_versioned") layout of dlpack.h.
"""
import ctypes

import numpy as np

KDL_CPU = 1
BFLOAT = 4
FLOAT = 2
FLOAT8_E4M3FN = 10
FLOAT8_E5M2 = 12
COMPLEX = 5
READ_ONLY = 1


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class _Versioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _Deleter), ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLTensor:
    """Only __dlpack__ (no buffer protocol), like a torch tensor."""

    def __init__(self, storage, code, bits, versioned=False, flags=0, strides=None, count=None):
        self.storage = storage  # owns the bytes; never freed while this object lives
        n = count if count is not None else storage.nbytes * 8 // bits
        self._shape = (ctypes.c_int64 * 1)(n)
        self._strides = (ctypes.c_int64 * 1)(strides) if strides is not None else None
        tensor = _Tensor(storage.ctypes.data, _Device(KDL_CPU, 0), 1, _DType(code, bits, 1), self._shape,
                         self._strides, 0)
        self._deleter = _Deleter(lambda _: None)  # the storage is owned here, not by the capsule
        if versioned:
            self._managed = _Versioned(1, 0, None, self._deleter, flags, tensor)
            self._name = b"dltensor_versioned"
        else:
            self._managed = _Managed(tensor, None, self._deleter)
            self._name = b"dltensor"

    def __dlpack__(self, stream=None, max_version=None):
        return _capsule_new(ctypes.addressof(self._managed), self._name, None)

    def __dlpack_device__(self):
        return (KDL_CPU, 0)


class DLOnly:
    """Hides a numpy array's buffer protocol, leaving numpy's own __dlpack__."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def bfloat16_bits(values):
    """bfloat16 bit patterns of values exactly representable in it."""
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


FLOAT8_ONE_TWO_FOUR = {FLOAT8_E4M3FN: {1: 0x38, 2: 0x40, 4: 0x48}, FLOAT8_E5M2: {1: 0x3C, 2: 0x40, 4: 0x44}}
