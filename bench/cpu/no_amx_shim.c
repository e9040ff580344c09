/*
 * bench/cpu/no_amx_shim.c — LD_PRELOAD shim for llama.cpp comparisons on
 * machines whose CPU reports AMX but whose kernel or hypervisor does not let
 * a process use it (tile instructions then die with SIGILL).
 *
 * A llama.cpp built with -march=native on such a CPU asks the kernel for AMX
 * tile state with arch_prctl(ARCH_REQ_XCOMP_PERM) and, when that succeeds,
 * routes quantized matmuls to AMX kernels. This shim makes that one request
 * fail, so llama.cpp takes its own "AMX is not available" path and runs its
 * AVX-512 kernels (including weight repacking), exactly as it would on a
 * machine without AMX. Every other system call passes through unchanged.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>

#define ARCH_REQ_XCOMP_PERM 0x1023

long syscall(long number, ...)
{
    va_list ap;
    va_start(ap, number);
    long a[6];
    for (int i = 0; i < 6; i++)
        a[i] = va_arg(ap, long);
    va_end(ap);
    if (number == SYS_arch_prctl && a[0] == ARCH_REQ_XCOMP_PERM) {
        errno = EPERM;
        return -1;
    }
    static long (*real)(long, ...);
    if (!real)
        real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
