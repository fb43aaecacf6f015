/*
 * tcpserve: a process that serves on a TCP port as a job's store or NCCL's
 * bootstrap does, no GPU: it listens on 127.0.0.1 (a free port, bound
 * without SO_REUSEADDR) and, every iteration, connects to itself, sends the
 * iteration's number, has the accepted connection answer it, and closes that
 * connection first, so that closed connections wait out their TIME_WAIT on
 * the listening port, as a server's do. A restore right after such a process
 * ended must bind that port again.
 *
 *   tcpserve [--iters N] [--interval-ms MS] [--hb-every E] [--unix DIR]
 *
 * With --unix DIR it serves on a unix socket instead, DIR/listener, in a
 * directory it makes and removes at its end, as Python's multiprocessing does
 * with its listeners (/tmp/pymp-*): a restore after such a process ended
 * finds the directory gone.
 *
 * Prints "ready pid=PID port=PORT", then "hb ITER SUM TIME" every E
 * iterations (SUM: a hash of every answer so far), "done ITER SUM" at the end.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
    fprintf(stderr, "tcpserve: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void xfer(int fd, void *buf, size_t n, int out) {
    char *p = buf;
    while (n) {
        ssize_t k = out ? write(fd, p, n) : read(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            die(out ? "write" : "read");
        p += k;
        n -= (size_t)k;
    }
}

int main(int argc, char **argv) {
    unsigned long iters = 1000, every = 10, interval = 10;
    const char *udir = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--iters") == 0)
            iters = strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--interval-ms") == 0)
            interval = strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--hb-every") == 0)
            every = strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--unix") == 0)
            udir = argv[i + 1];
        else {
            fprintf(stderr, "usage: tcpserve [--iters N] [--interval-ms MS] [--hb-every E] [--unix DIR]\n");
            return 2;
        }
    }
    if (every == 0)
        every = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_un u = {.sun_family = AF_UNIX};
    struct sockaddr *addr = (struct sockaddr *)&a;
    socklen_t alen = sizeof a;
    int family = AF_INET;
    if (udir) {
        if (mkdir(udir, 0700) != 0 || strlen(udir) + sizeof "/listener" > sizeof u.sun_path)
            die("mkdir");
        snprintf(u.sun_path, sizeof u.sun_path, "%s/listener", udir);
        addr = (struct sockaddr *)&u;
        alen = sizeof u;
        family = AF_UNIX;
    }
    int ls = socket(family, SOCK_STREAM, 0);
    if (ls < 0 || bind(ls, addr, alen) != 0 || listen(ls, 16) != 0 || (!udir && getsockname(ls, addr, &alen) != 0))
        die("listen");
    printf("ready pid=%d port=%d\n", (int)getpid(), udir ? 0 : ntohs(a.sin_port));
    fflush(stdout);
    uint64_t sum = 1469598103934665603ULL;
    for (unsigned long it = 1; it <= iters; it++) {
        int c = socket(family, SOCK_STREAM, 0);
        if (c < 0 || connect(c, addr, alen) != 0)
            die("connect");
        int s = accept(ls, NULL, NULL);
        if (s < 0)
            die("accept");
        uint64_t v = it, w = 0;
        xfer(c, &v, sizeof v, 1);
        xfer(s, &w, sizeof w, 0);
        w = w * 0x9E3779B97F4A7C15ULL + 1;
        xfer(s, &w, sizeof w, 1);
        xfer(c, &v, sizeof v, 0);
        close(s); /* the server's side first: its TIME_WAIT is on the listening port */
        close(c);
        sum = (sum ^ v) * 1099511628211ULL;
        if (it % every == 0) {
            struct timespec now;
            clock_gettime(CLOCK_REALTIME, &now);
            printf("hb %lu %016llx %ld.%03ld\n", it, (unsigned long long)sum, (long)now.tv_sec, now.tv_nsec / 1000000);
            fflush(stdout);
        }
        struct timespec t = {(time_t)(interval / 1000), (long)(interval % 1000) * 1000000L};
        nanosleep(&t, NULL);
    }
    printf("done %lu %016llx\n", iters, (unsigned long long)sum);
    if (udir && (unlink(u.sun_path) != 0 || rmdir(udir) != 0))
        die("remove the listener's directory");
    return 0;
}
