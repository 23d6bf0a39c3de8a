/* The pod sandbox's pause process for the CRI tests: holds the pod's
 * namespaces, reaps orphans (it is pid 1 of the pod), exits on SIGINT/SIGTERM.
 * Built static by the test harness (tests/src/cri.rs) into the pause image. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { _exit(sig == SIGTERM || sig == SIGINT ? 0 : 2); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction q = {.sa_handler = quit}, r = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &q, NULL);
    sigaction(SIGTERM, &q, NULL);
    sigaction(SIGCHLD, &r, NULL);
    for (;;)
        pause();
}
