/*
 * A stand-in libcuda.so.1 for tests: the part of the CUDA driver API safe-serve's probe calls
 * (launcher/probe/cuda_driver.py) - cuInit, cuDeviceGetCount, cuDeviceGet, cuDeviceGetUuid(_v2),
 * cuDeviceTotalMem_v2 - with the driver's signatures and error codes.
 *
 * It reads the same fixture as the NVML stand-in (SAFE_SERVE_NVML_STUB_FIXTURE, nvml_stub.c):
 *
 *   system  ... cuinit=CODE cudelay_ms=N cucrash=1 (cuInit returns CODE after sleeping N ms;
 *                                                    cucrash: it aborts the process instead)
 *   gpu     ... uuid=GPU-... mig=on|off cuda_total=N
 *   mig     ... uuid=MIG-... cuda_total=N
 *
 * A device without cuda_total is one the CUDA driver does not enumerate. Enumeration follows
 * CUDA's rules for what the probe relies on: CUDA_VISIBLE_DEVICES, when set, lists UUIDs and
 * picks those devices in that order; unset, every whole GPU without MIG, then the first MIG
 * instance. A process enumerates one MIG device at most, however many are named, and a GPU in
 * MIG mode is never a CUDA device itself. Built with -DSTUB_NO_UUID_V2 or -DSTUB_OLD_DRIVER it lacks cuDeviceGetUuid_v2 (before CUDA 11.4).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef struct { char bytes[16]; } CUuuid;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_UNKNOWN = 999,
};

#define MAX_DEVICES 32
#define TEXT 96

typedef struct {
    char uuid[TEXT];
    unsigned long long total;
    int is_mig, mig_mode;
} cuda_device;

static cuda_device known[MAX_DEVICES], visible[MAX_DEVICES];
static int nknown, nvisible, initialised;

/* The value of `key=` in a line of space-separated pairs (values may be "quoted"), or "". */
static void field(const char *line, const char *key, char *out) {
    size_t n = strlen(key);
    out[0] = '\0';
    for (const char *p = line; (p = strstr(p, key)) != NULL; p += n) {
        if ((p != line && p[-1] != ' ' && p[-1] != '\t') || p[n] != '=') continue;
        const char *v = p + n + 1, *end;
        if (*v == '"') {
            end = strchr(++v, '"');
        } else {
            end = v + strcspn(v, " \t\n");
        }
        if (!end) return;
        snprintf(out, TEXT, "%.*s", (int)(end - v), v);
        return;
    }
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* GPU-8f2a1c3e-5b7d-... / MIG-...: the 16 bytes after the prefix. */
static int uuid_bytes(const char *text, char out[16]) {
    const char *dash = strchr(text, '-');
    int digits = 0;
    if (!dash) return -1;
    for (const char *p = dash + 1; *p && digits < 32; p++) {
        if (*p == '-') continue;
        int high = hex_value(*p);
        if (high < 0) return -1;
        if (digits % 2 == 0) out[digits / 2] = (char)(high << 4);
        else out[digits / 2] = (char)(out[digits / 2] | high);
        digits++;
    }
    return digits == 32 ? 0 : -1;
}

static int load(void) {
    const char *path = getenv("SAFE_SERVE_NVML_STUB_FIXTURE");
    FILE *file = path ? fopen(path, "r") : NULL;
    char line[1024], value[TEXT];
    int code = CUDA_SUCCESS, delay_ms = 0, crash = 0;
    if (!file) return CUDA_ERROR_UNKNOWN;
    nknown = nvisible = 0;
    while (fgets(line, sizeof line, file)) {
        const char *p = line + strspn(line, " \t");
        int gpu = !strncmp(p, "gpu ", 4), mig = !strncmp(p, "mig ", 4);
        if (!strncmp(p, "system ", 7)) {
            field(p, "cuinit", value);
            if (value[0]) code = atoi(value);
            field(p, "cudelay_ms", value);
            if (value[0]) delay_ms = atoi(value);
            field(p, "cucrash", value);
            crash = value[0] == '1';
        }
        if ((!gpu && !mig) || nknown == MAX_DEVICES) continue;
        cuda_device *dev = &known[nknown];
        memset(dev, 0, sizeof *dev);
        field(p, "uuid", dev->uuid);
        field(p, "cuda_total", value);
        dev->total = value[0] ? strtoull(value, NULL, 10) : 0;
        field(p, "mig", value);
        dev->is_mig = mig;
        dev->mig_mode = gpu && !strcmp(value, "on");
        nknown++;
    }
    fclose(file);
    if (crash) abort();
    if (delay_ms > 0) {
        struct timespec pause = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
        nanosleep(&pause, NULL);
    }
    return code;
}

static int enumerable(const cuda_device *dev) {
    return dev->total != 0 && !dev->mig_mode;
}

static void enumerate(void) {
    const char *wanted = getenv("CUDA_VISIBLE_DEVICES");
    if (wanted) {
        char list[4096];
        snprintf(list, sizeof list, "%s", wanted);
        int mig_taken = 0;
        for (char *item = strtok(list, ","); item && nvisible < MAX_DEVICES; item = strtok(NULL, ",")) {
            int found = 0;
            for (int i = 0; i < nknown && !found; i++)
                if (!strcmp(known[i].uuid, item) && enumerable(&known[i])) {
                    found = 1;
                    if (known[i].is_mig && mig_taken++) continue; /* one MIG device per process */
                    visible[nvisible++] = known[i];
                }
            if (!found) return; /* CUDA stops at the first entry it cannot use */
        }
        return;
    }
    int mig_taken = 0;
    for (int i = 0; i < nknown; i++) {
        if (!enumerable(&known[i]) || (known[i].is_mig && mig_taken)) continue;
        mig_taken |= known[i].is_mig;
        visible[nvisible++] = known[i];
    }
}

API CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    int code = load();
    if (code != CUDA_SUCCESS) return code;
    enumerate();
    initialised = 1;
    return nvisible ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

API CUresult cuDeviceGetCount(int *count) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = nvisible;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

static CUresult get_uuid(CUuuid *uuid, CUdevice device, int v2) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    if (device < 0 || device >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
    if (visible[device].is_mig && !v2) {
        /* the entry point before 11.4 may answer for a MIG device with its parent GPU's UUID */
        for (int i = 0; i < nknown; i++)
            if (known[i].mig_mode) return uuid_bytes(known[i].uuid, uuid->bytes) ? CUDA_ERROR_UNKNOWN : CUDA_SUCCESS;
    }
    return uuid_bytes(visible[device].uuid, uuid->bytes) ? CUDA_ERROR_UNKNOWN : CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice device) {
    return get_uuid(uuid, device, 0);
}

#if !defined(STUB_NO_UUID_V2) && !defined(STUB_OLD_DRIVER)
API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice device) {
    return get_uuid(uuid, device, 1);
}
#endif

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (device < 0 || device >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)visible[device].total;
    return CUDA_SUCCESS;
}
