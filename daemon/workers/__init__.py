"""Engine workers: the ZeroMQ broker, the wire protocol, supervision, identity."""
