import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(__file__))


def _two_logical_cpus() -> None:
    """Splits the CPU into two logical devices, "/cpu:0" and "/cpu:1", so the tf.distribute
    tests run MirroredStrategy with two replicas on any machine (flavours.mirrored()).

    TF allows this only before its devices are initialized, which is why it happens here,
    before any test module runs an op. Ops still default to "/cpu:0"; only code that asks
    for every device (a MirroredStrategy() without a device list) sees the second one.
    """
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    if cpus and len(tf.config.get_logical_device_configuration(cpus[0]) or []) < 2:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)


_two_logical_cpus()
