/*
 * A stand-in libnvidia-ml.so.1 for tests: the real `pynvml` module loads it through
 * ctypes, so the probe runs against pynvml's own struct layouts and error codes.
 *
 * Everything it reports comes from a fixture file named by SAFE_SERVE_NVML_STUB_FIXTURE,
 * read at each nvmlInit*. One record per line, `#` starts a comment, values may be quoted:
 *
 *   init    code=9                                   (nvmlInit* returns this code)
 *   system  driver=550.54.15 nvml=12.550.54.15 cuda=12040 fail=cuda:3
 *   gpu     name="NVIDIA H100 80GB HBM3" uuid=GPU-... total=N reserved=N free=N used=N
 *           cc=9.0 mig=on|off|unsupported max_mig=7 fail=memory:3,processes:3
 *   mig     parent=GPU-... slot=0 name=... uuid=MIG-... total=N reserved=N free=N used=N
 *           gi=1 ci=0 fail=...
 *   proc    device=GPU-...|MIG-... kind=compute|graphics pid=N used=N|na
 *
 * `fail=FAMILY:CODE,...` makes every call of that family on that device return CODE;
 * families: handle name uuid memory cc mig processes (and cuda on the system line).
 * Built with -DSTUB_OLD_DRIVER it lacks the newer entry points (memory _v2, process
 * _v3, CUDA version _v2), like a pre-R510 driver, so callers must fall back.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

/* Layouts as nvml.h (and pynvml's c_nvmlMemory_t / _v2_t / c_nvmlProcessInfo_v2_t) define them. */
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#define NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

#define MAX_DEVICES 32
#define MAX_PROCS 32
#define MAX_FAILS 8
#define TEXT 96

typedef struct stub_device {
    struct stub_device *parent; /* NULL for a whole GPU */
    unsigned int index, slot, gi, ci, max_mig;
    char name[TEXT], uuid[TEXT];
    unsigned long long total, reserved, free, used;
    int cc_major, cc_minor;
    int mig_mode; /* 0 off, 1 on, -1 not supported */
    unsigned int nprocs[2];
    nvmlProcessInfo_t procs[2][MAX_PROCS]; /* [0] compute, [1] graphics */
    int nfails;
    struct { char family[16]; int code; } fails[MAX_FAILS];
} stub_device;

typedef stub_device *nvmlDevice_t;

static stub_device devices[MAX_DEVICES];
static int ndevices, ngpus, init_refcount, system_cuda_fail;
static int init_code, system_cuda;
static char system_driver[TEXT], system_nvml[TEXT];

static void copy_text(char *dst, const char *src) {
    snprintf(dst, TEXT, "%s", src);
}

/* ---- fixture parsing ---------------------------------------------------------- */

/* Splits `key=value` tokens in place; values may be "double quoted". */
static int next_pair(char **cursor, char **key, char **value) {
    char *p = *cursor;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '\0' || *p == '#' || *p == '\n') return 0;
    *key = p;
    while (*p && *p != '=' && *p != ' ' && *p != '\n') p++;
    if (*p != '=') return -1;
    *p++ = '\0';
    if (*p == '"') {
        *value = ++p;
        while (*p && *p != '"') p++;
        if (*p != '"') return -1;
    } else {
        *value = p;
        while (*p && *p != ' ' && *p != '\t' && *p != '\n') p++;
    }
    if (*p) *p++ = '\0';
    *cursor = p;
    return 1;
}

static stub_device *find_device(const char *uuid) {
    for (int i = 0; i < ndevices; i++)
        if (strcmp(devices[i].uuid, uuid) == 0) return &devices[i];
    return NULL;
}

static void parse_fails(stub_device *dev, char *spec) {
    for (char *item = strtok(spec, ","); item; item = strtok(NULL, ",")) {
        char *colon = strchr(item, ':');
        if (!colon || dev->nfails == MAX_FAILS) continue;
        *colon = '\0';
        snprintf(dev->fails[dev->nfails].family, 16, "%s", item);
        dev->fails[dev->nfails++].code = atoi(colon + 1);
    }
}

static void set_device_field(stub_device *dev, const char *key, char *value) {
    if (!strcmp(key, "name")) copy_text(dev->name, value);
    else if (!strcmp(key, "uuid")) copy_text(dev->uuid, value);
    else if (!strcmp(key, "total")) dev->total = strtoull(value, NULL, 10);
    else if (!strcmp(key, "reserved")) dev->reserved = strtoull(value, NULL, 10);
    else if (!strcmp(key, "free")) dev->free = strtoull(value, NULL, 10);
    else if (!strcmp(key, "used")) dev->used = strtoull(value, NULL, 10);
    else if (!strcmp(key, "cc")) sscanf(value, "%d.%d", &dev->cc_major, &dev->cc_minor);
    else if (!strcmp(key, "mig")) dev->mig_mode = !strcmp(value, "on") ? 1 : !strcmp(value, "off") ? 0 : -1;
    else if (!strcmp(key, "max_mig")) dev->max_mig = (unsigned)atoi(value);
    else if (!strcmp(key, "slot")) dev->slot = (unsigned)atoi(value);
    else if (!strcmp(key, "gi")) dev->gi = (unsigned)atoi(value);
    else if (!strcmp(key, "ci")) dev->ci = (unsigned)atoi(value);
    else if (!strcmp(key, "parent")) dev->parent = find_device(value);
    else if (!strcmp(key, "fail")) parse_fails(dev, value);
}

static int parse_proc(char *rest) {
    char *key, *value;
    stub_device *dev = NULL;
    int kind = 0, rc;
    nvmlProcessInfo_t info = {0, 0, 0xFFFFFFFFu, 0xFFFFFFFFu};
    while ((rc = next_pair(&rest, &key, &value)) == 1) {
        if (!strcmp(key, "device")) dev = find_device(value);
        else if (!strcmp(key, "kind")) kind = !strcmp(value, "graphics");
        else if (!strcmp(key, "pid")) info.pid = (unsigned)strtoul(value, NULL, 10);
        else if (!strcmp(key, "used"))
            info.usedGpuMemory = !strcmp(value, "na") ? ~0ULL : strtoull(value, NULL, 10);
    }
    if (rc < 0 || !dev || dev->nprocs[kind] == MAX_PROCS) return -1;
    dev->procs[kind][dev->nprocs[kind]++] = info;
    return 0;
}

static int parse_line(char *line) {
    char *rest = line, *key, *value;
    int rc;
    while (*rest == ' ' || *rest == '\t') rest++;
    if (*rest == '\0' || *rest == '#' || *rest == '\n') return 0;
    char *kind = rest;
    while (*rest && *rest != ' ' && *rest != '\n') rest++;
    if (*rest) *rest++ = '\0';

    if (!strcmp(kind, "proc")) return parse_proc(rest);
    if (!strcmp(kind, "init") || !strcmp(kind, "system")) {
        while ((rc = next_pair(&rest, &key, &value)) == 1) {
            if (!strcmp(key, "code")) init_code = atoi(value);
            else if (!strcmp(key, "driver")) copy_text(system_driver, value);
            else if (!strcmp(key, "nvml")) copy_text(system_nvml, value);
            else if (!strcmp(key, "cuda")) system_cuda = atoi(value);
            else if (!strcmp(key, "fail") && !strncmp(value, "cuda:", 5)) system_cuda_fail = atoi(value + 5);
        }
        return rc;
    }
    if (strcmp(kind, "gpu") && strcmp(kind, "mig")) return -1;
    if (ndevices == MAX_DEVICES) return -1;
    stub_device *dev = &devices[ndevices];
    memset(dev, 0, sizeof *dev);
    while ((rc = next_pair(&rest, &key, &value)) == 1) set_device_field(dev, key, value);
    if (rc < 0) return -1;
    if (!strcmp(kind, "mig")) {
        if (!dev->parent) return -1; /* parent= must name an earlier gpu's uuid */
        dev->index = dev->parent->index;
        dev->mig_mode = -1;
        if (!dev->cc_major) { /* an instance is a slice of its parent: same architecture */
            dev->cc_major = dev->parent->cc_major;
            dev->cc_minor = dev->parent->cc_minor;
        }
    } else {
        dev->index = (unsigned)ngpus++;
    }
    ndevices++;
    return 0;
}

static nvmlReturn_t load_fixture(void) {
    const char *path = getenv("SAFE_SERVE_NVML_STUB_FIXTURE");
    FILE *file = path ? fopen(path, "r") : NULL;
    if (!file) {
        fprintf(stderr, "nvml stub: cannot open fixture %s\n", path ? path : "(SAFE_SERVE_NVML_STUB_FIXTURE unset)");
        return NVML_ERROR_UNKNOWN;
    }
    ndevices = ngpus = init_code = system_cuda = system_cuda_fail = 0;
    system_driver[0] = system_nvml[0] = '\0';
    char line[1024];
    int lineno = 0;
    nvmlReturn_t rc = NVML_SUCCESS;
    while (fgets(line, sizeof line, file)) {
        lineno++;
        if (parse_line(line) < 0) {
            fprintf(stderr, "nvml stub: %s:%d: cannot parse this line\n", path, lineno);
            rc = NVML_ERROR_UNKNOWN;
            break;
        }
    }
    fclose(file);
    return rc;
}

/* ---- helpers shared by the entry points ---------------------------------------- */

static int injected(const stub_device *dev, const char *family) {
    for (int i = 0; i < dev->nfails; i++)
        if (!strcmp(dev->fails[i].family, family)) return dev->fails[i].code;
    return NVML_SUCCESS;
}

static int valid(const stub_device *dev) {
    return dev >= devices && dev < devices + ndevices;
}

#define CHECK_DEVICE(dev, family)                                   \
    do {                                                            \
        if (init_refcount == 0) return NVML_ERROR_UNINITIALIZED;    \
        if (!valid(dev)) return NVML_ERROR_INVALID_ARGUMENT;        \
        int injected_code = injected(dev, family);                  \
        if (injected_code) return injected_code;                    \
    } while (0)

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src) {
    if (!dst || strlen(src) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t processes(stub_device *dev, int kind, unsigned int *count, nvmlProcessInfo_t *infos) {
    CHECK_DEVICE(dev, "processes");
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int have = dev->nprocs[kind];
    if (*count < have || (have && !infos)) {
        *count = have;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(infos, dev->procs[kind], have * sizeof *infos);
    *count = have;
    return NVML_SUCCESS;
}

/* ---- the exported NVML entry points --------------------------------------------- */

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    nvmlReturn_t rc = load_fixture();
    if (rc != NVML_SUCCESS) return rc;
    if (init_code != NVML_SUCCESS) return init_code;
    init_refcount++;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void) {
    if (init_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    init_refcount--;
    return NVML_SUCCESS;
}

API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (init_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, system_driver);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (init_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, system_nvml);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (init_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    if (system_cuda_fail) return system_cuda_fail;
    *version = system_cuda;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (init_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    *count = (unsigned)ngpus;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (init_refcount == 0) return NVML_ERROR_UNINITIALIZED;
    for (int i = 0; i < ndevices; i++) {
        if (!devices[i].parent && devices[i].index == index) {
            int code = injected(&devices[i], "handle");
            if (code) return code;
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index) {
    CHECK_DEVICE(dev, "index");
    *index = dev->index;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    CHECK_DEVICE(dev, "name");
    return copy_string(name, length, dev->name);
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    CHECK_DEVICE(dev, "uuid");
    return copy_string(uuid, length, dev->uuid);
}

/* v1 has no `reserved`: the driver counts it as used, as real NVML does. */
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *memory) {
    CHECK_DEVICE(dev, "memory");
    memory->total = dev->total;
    memory->free = dev->free;
    memory->used = dev->used + dev->reserved;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t dev, int *major, int *minor) {
    CHECK_DEVICE(dev, "cc");
    *major = dev->cc_major;
    *minor = dev->cc_minor;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *current, unsigned int *pending) {
    CHECK_DEVICE(dev, "mig");
    if (dev->mig_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned)dev->mig_mode;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned int *count) {
    CHECK_DEVICE(dev, "mig");
    if (dev->mig_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    *count = dev->max_mig;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned int index, nvmlDevice_t *mig) {
    CHECK_DEVICE(dev, "mig");
    if (dev->mig_mode != 1 || index >= dev->max_mig) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < ndevices; i++) {
        if (devices[i].parent == dev && devices[i].slot == index) {
            *mig = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND; /* an empty slot, as on real hardware */
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t dev, unsigned int *is_mig) {
    CHECK_DEVICE(dev, "index");
    *is_mig = dev->parent != NULL;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t dev, nvmlDevice_t *parent) {
    CHECK_DEVICE(dev, "index");
    if (!dev->parent) return NVML_ERROR_INVALID_ARGUMENT;
    *parent = dev->parent;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned int *id) {
    CHECK_DEVICE(dev, "mig");
    if (!dev->parent) return NVML_ERROR_NOT_SUPPORTED;
    *id = dev->gi;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned int *id) {
    CHECK_DEVICE(dev, "mig");
    if (!dev->parent) return NVML_ERROR_NOT_SUPPORTED;
    *id = dev->ci;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(dev, 0, count, infos);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t dev, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(dev, 1, count, infos);
}

#ifndef STUB_OLD_DRIVER
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *memory) {
    CHECK_DEVICE(dev, "memory");
    if (memory->version != NVML_MEMORY_V2_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = dev->total;
    memory->reserved = dev->reserved;
    memory->free = dev->free;
    memory->used = dev->used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(dev, 0, count, infos);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(dev, 1, count, infos);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    return nvmlSystemGetCudaDriverVersion(version);
}
#endif
