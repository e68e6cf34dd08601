"""The interpreter: a rank's stages (built from the plan), their stage kernels, and the handlers that
run a program's actions, with the transport, chunk buffers, weight versions and activation meter
they use. The runtime's lowest part: it knows no job, process or method name."""
