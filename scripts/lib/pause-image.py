"""Builds the node's pause (sandbox) image offline: a tiny static C program that handles
SIGINT/SIGTERM, reaps children and sleeps in pause(). Prints the archive's path."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docker_archive  # noqa: E402

PAUSE_C = r"""
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
    struct sigaction term = {.sa_handler = stop}, child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &term, NULL);
    sigaction(SIGTERM, &term, NULL);
    sigaction(SIGCHLD, &child, NULL);
    for (;;) pause();
}
"""

out_dir = sys.argv[1]
out = os.path.join(out_dir, "pause.tar")
with tempfile.TemporaryDirectory() as tmp:
    src, binary = os.path.join(tmp, "pause.c"), os.path.join(tmp, "pause")
    with open(src, "w") as f:
        f.write(PAUSE_C)
    subprocess.run(["gcc", "-Os", "-static", "-o", binary, src], check=True)
    subprocess.run(["strip", binary], check=True)
    layer = docker_archive.Layer()
    layer.add_file("pause", binary, 0o755)
    docker_archive.write(out, "load-control-pause:1", layer, entrypoint=["/pause"], user="65535")
print(out)
