/* The stand-in's "compiled Triton launcher": a tiny shared library whose bytes the
 * fixture puts in the rootfs as data (/opt/standin/cuda_utils.so.bin). At cold start
 * the EngineCore copies it into ~/.triton/cache/<sha256>/cuda_utils.so and keeps it
 * loaded (mapped) with ctypes.CDLL for the life of the process, as Triton does. */
int vsnap_launcher_ok(void) { return 42; }
