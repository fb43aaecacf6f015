/*
 * The driver's device file: what keeps an initialized process from being
 * dumped by CRIU until the driver has checkpointed it.
 *
 * The real driver holds open files and shared mappings of /dev/nvidiactl,
 * /dev/nvidia0 and /dev/nvidia-uvm, which CRIU cannot dump; its checkpoint
 * releases them in the checkpointed process and its restore makes them again.
 * A forked child inherits them, can never use them (every driver call answers
 * CUDA_ERROR_NOT_INITIALIZED there), and is not released by anyone's
 * checkpoint: that is why a process tree with PyTorch DataLoader workers
 * could not be dumped. The simulation needs a device node it can open on a
 * machine without a GPU; it uses a software perf event of the process on
 * itself (counting nothing), an anonymous inode CRIU refuses just the same
 * ("Can't dump file ... of that type ... anon [perf_event]").
 *
 * Where perf events are not allowed (perf_event_paranoid 3, a seccomp profile
 * without perf_event_open) the simulation goes on without one and says so in
 * its log (GPUCR_SIM_LOG).
 */
#include <errno.h>
#include <linux/perf_event.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sim.h"

static int devfd = -1;

void sim_devfile_open(void) {
    if (devfd >= 0)
        return;
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_DUMMY;
    a.disabled = 1;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    long fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) {
        sim_log("no device file: perf_event_open: %s (CRIU could dump this process without a checkpoint)",
                strerror(errno));
        return;
    }
    devfd = (int)fd;
}

void sim_devfile_close(void) {
    if (devfd >= 0)
        close(devfd);
    devfd = -1;
}
