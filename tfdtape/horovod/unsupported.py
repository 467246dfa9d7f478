"""What Horovod has and tfdtape.horovod does not: each refused with what to
use instead, never a silent no-op."""

from tfdtape import errors

ALTERNATIVES = {
    "Adasum": (
        "the Adasum reduction",
        "hvd.Average, hvd.Sum, hvd.Min, hvd.Max or hvd.Product",
        "use op=hvd.Average (Horovod's default)"),
    "timeline": (
        "Horovod's timeline",
        "TensorFlow's profiler",
        "use tf.profiler.experimental.start(logdir) / stop()"),
    "join": (
        "hvd.join (uneven numbers of steps per process)",
        "the same number of steps on every process",
        "give every process the same number of batches (tf.data's shard and take)"),
}


def refuse(feature):
    """Raises NotImplementedError naming `feature` and the alternative."""
    what, expected, remedy = ALTERNATIVES[feature]
    raise NotImplementedError(errors.message(
        f"{what} is not in tfdtape.horovod", "tfdtape.horovod", expected, what,
        remedy))


def refusing(feature):
    """A function that refuses `feature` whatever it is called with."""
    def refused(*_args, **_kwargs):
        refuse(feature)
    refused.__name__ = feature
    refused.__doc__ = f"Not in tfdtape.horovod: raises NotImplementedError ({feature})."
    return refused
