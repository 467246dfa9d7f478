"""Horovod's gradient compression: what a tensor travels as between
processes (`Compression.none`, `Compression.fp16`)."""

import tensorflow as tf


class NoneCompressor:
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, context):
        return tensor

    @staticmethod
    def wire_dtype(dtype):
        return dtype


class FP16Compressor:
    """Sends floating-point tensors as float16, and casts them back."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, context):
        return tensor if context is None else tf.cast(tensor, context)

    @staticmethod
    def wire_dtype(dtype):
        return tf.float16 if dtype.is_floating else dtype


class Compression:
    """Horovod's names for the compressors."""
    none = NoneCompressor
    fp16 = FP16Compressor
