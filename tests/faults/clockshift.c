/*
 * LD_PRELOAD shim: shift the wall clock, never the monotonic one.
 *
 * PGCROND_CLOCK_SHIFT_MS (signed milliseconds, read once when the library is
 * loaded) is added to CLOCK_REALTIME and CLOCK_REALTIME_COARSE as returned by
 * clock_gettime(), and to gettimeofday() and time(). CLOCK_MONOTONIC and every
 * other clock pass through unchanged.
 *
 * No locks, no lazy initialisation, no allocation after load: the state is two
 * words written by the constructor, so a child forked from a threaded parent
 * (libfaketime deadlocks there) inherits it and never waits on anything.
 * Before the constructor has run, calls go straight to the kernel.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static long long shift_ns = 0;
static clock_gettime_fn real_clock_gettime = NULL;

__attribute__((constructor)) static void clockshift_init(void) {
    const char *value = getenv("PGCROND_CLOCK_SHIFT_MS");
    if (value != NULL && *value != '\0') {
        shift_ns = strtoll(value, NULL, 10) * 1000000LL;
    }
    real_clock_gettime = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
}

static int raw_clock_gettime(clockid_t clock, struct timespec *ts) {
    if (real_clock_gettime != NULL) {
        return real_clock_gettime(clock, ts);
    }
    return (int)syscall(SYS_clock_gettime, clock, ts);
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + shift_ns;
    long long sec = ns / 1000000000LL;
    long long rem = ns % 1000000000LL;
    if (rem < 0) {
        rem += 1000000000LL;
        sec -= 1;
    }
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)rem;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int result = raw_clock_gettime(clock, ts);
    if (result == 0 && ts != NULL && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        shift(ts);
    }
    return result;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    int result = raw_clock_gettime(CLOCK_REALTIME, &ts);
    if (result != 0) {
        return result;
    }
    shift(&ts);
    if (tv != NULL) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    if (tz != NULL) {
        struct timezone *zone = tz;
        zone->tz_minuteswest = 0;
        zone->tz_dsttime = 0;
    }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (raw_clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return (time_t)-1;
    }
    shift(&ts);
    if (out != NULL) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
