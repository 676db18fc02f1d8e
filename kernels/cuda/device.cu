/* Device set-up, memory helpers, the error check behind KCUDA_CHECK, and weight
 * matrix descriptions for the CUDA kernels. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kcuda_impl.cuh"

int kcuda__check(int code, const char *call, const char *file, int line, bl_err_t *err)
{
    if (code == 0)
        return 0;
    const cudaError_t e = (cudaError_t)code;
    int rc = BL_EIO;
    if (e == cudaErrorMemoryAllocation)
        rc = BL_ENOMEM;
    else if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorInvalidDevice)
        rc = BL_ENOTSUP;
    else if (e == cudaErrorInvalidValue || e == cudaErrorInvalidConfiguration)
        rc = BL_EINVAL;
    /* Clears a sticky-free error so the next call does not report it again. */
    (void)cudaGetLastError();
    return bl_err_set(err, rc, "%s failed at %s:%d: %s (code %d)", call, file, line,
                      cudaGetErrorString(e), code);
}

int kcuda_device_count(int *n, bl_err_t *err)
{
    *n = 0;
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        (void)cudaGetLastError();
        return 0;
    }
    KCUDA_CHECK(e, err);
    *n = count;
    return 0;
}

static int g_pdl = 1;
#define PDL_MAX_DEVICES 16
static int g_cc_major[PDL_MAX_DEVICES]; /* 0: not read yet */

int kcuda_set_pdl(int on)
{
    const int old = g_pdl;
    g_pdl = on ? 1 : 0;
    return old;
}

int kcuda__pdl_on(void)
{
    if (!g_pdl)
        return 0;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= PDL_MAX_DEVICES) {
        (void)cudaGetLastError();
        return 0;
    }
    if (g_cc_major[dev] == 0) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        g_cc_major[dev] = major; /* every thread that gets here writes the same value */
    }
    return g_cc_major[dev] >= 9;
}

/* Per device: SM count and the opt-in shared-memory limit per block (0: not read
 * yet). Written once per device by whichever thread gets there first; every writer
 * writes the same values. */
static int g_sm_count[KC_MAX_DEVICES], g_smem_optin[KC_MAX_DEVICES];

int kc_device_limits(int *dev, int *sms, int *optin, bl_err_t *err)
{
    KCUDA_CHECK(cudaGetDevice(dev), err);
    if (*dev >= 0 && *dev < KC_MAX_DEVICES && g_sm_count[*dev] > 0) {
        *sms = g_sm_count[*dev];
        *optin = g_smem_optin[*dev];
        return 0;
    }
    KCUDA_CHECK(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, *dev), err);
    KCUDA_CHECK(cudaDeviceGetAttribute(optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, *dev), err);
    if (*dev >= 0 && *dev < KC_MAX_DEVICES) {
        g_smem_optin[*dev] = *optin;
        g_sm_count[*dev] = *sms;
    }
    return 0;
}

int kcuda_init(int device, kcuda_device_info_t *info, bl_err_t *err)
{
    int n = 0;
    int rc = kcuda_device_count(&n, err);
    if (rc < 0)
        return rc;
    if (device < 0 || device >= n)
        return bl_err_set(err, BL_ENOTSUP, "CUDA device %d does not exist (%d device%s)", device, n,
                          n == 1 ? "" : "s");
    KCUDA_CHECK(cudaSetDevice(device), err);
    KCUDA_CHECK(cudaFree(0), err); /* creates the context now, not in the first step */
    if (!info)
        return 0;
    if ((rc = kcuda_device_query(device, info, err)) < 0)
        return rc;
    /* CUDA 13 dropped memoryClockRate from the properties; the attribute may be
     * refused too, in which case the peak stays unknown (0). */
    int khz = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess) {
        (void)cudaGetLastError();
        khz = 0;
    }
    info->mem_clock_khz = khz;
    info->peak_gbs = 2.0 * (double)khz * 1e3 * (double)info->bus_bits / 8.0 / 1e9;
    size_t fr = 0, tot = 0;
    KCUDA_CHECK(cudaMemGetInfo(&fr, &tot), err);
    info->free_bytes = fr;
    return 0;
}

int kcuda_mem_free(size_t *free_bytes, bl_err_t *err)
{
    size_t tot = 0;
    *free_bytes = 0;
    KCUDA_CHECK(cudaMemGetInfo(free_bytes, &tot), err);
    return 0;
}

int kcuda_alloc(void **d_out, size_t nbytes, bl_err_t *err)
{
    *d_out = NULL;
    if (nbytes > SIZE_MAX - 255)
        return bl_err_set(err, BL_ERANGE, "device allocation of %zu bytes overflows", nbytes);
    const size_t len = (nbytes + 255) & ~(size_t)255;
    const cudaError_t e = cudaMalloc(d_out, len ? len : 256);
    if (e == cudaErrorMemoryAllocation) {
        /* The case a user meets with a model larger than the card: say by how much. */
        (void)cudaGetLastError();
        *d_out = NULL;
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
            (void)cudaGetLastError();
            return bl_err_set(err, BL_ENOMEM, "out of device memory for %.2f GiB",
                              (double)len / (1 << 30));
        }
        return bl_err_set(err, BL_ENOMEM,
                          "out of device memory: %.2f GiB asked, %.2f GiB of the device's %.2f GiB "
                          "free", (double)len / (1 << 30), (double)free_b / (1 << 30),
                          (double)total_b / (1 << 30));
    }
    KCUDA_CHECK(e, err);
    return 0;
}

void kcuda_free(void *d_p)
{
    if (d_p)
        (void)cudaFree(d_p); /* nothing useful to do with a failure at teardown */
}

int kcuda_upload(void *d_dst, const void *src, size_t nbytes, void *stream, bl_err_t *err)
{
    KCUDA_CHECK(cudaMemcpyAsync(d_dst, src, nbytes, cudaMemcpyHostToDevice, (cudaStream_t)stream), err);
    return 0;
}

int kcuda_download(void *dst, const void *d_src, size_t nbytes, void *stream, bl_err_t *err)
{
    KCUDA_CHECK(cudaMemcpyAsync(dst, d_src, nbytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream), err);
    return 0;
}

int kcuda_memset(void *d_dst, int byte, size_t nbytes, void *stream, bl_err_t *err)
{
    KCUDA_CHECK(cudaMemsetAsync(d_dst, byte, nbytes, (cudaStream_t)stream), err);
    return 0;
}

int kcuda_sync(void *stream, bl_err_t *err)
{
    KCUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream), err);
    KCUDA_CHECK(cudaGetLastError(), err);
    return 0;
}

/* Each stream's scratch (kc_stream_scratch): a table under a lock, looked up at
 * launch; the legacy default stream's one per device, made at its first use. */
#define SCR_MAX 64
static struct {
    cudaStream_t s;
    int dev;
    void *p;
} g_scr[SCR_MAX];
static pthread_mutex_t g_scr_mu = PTHREAD_MUTEX_INITIALIZER;

static void scr_add(cudaStream_t s, int dev, void *p)
{
    pthread_mutex_lock(&g_scr_mu);
    for (int i = 0; i < SCR_MAX; i++)
        if (!g_scr[i].p) {
            g_scr[i].s = s;
            g_scr[i].dev = dev;
            g_scr[i].p = p;
            p = NULL;
            break;
        }
    pthread_mutex_unlock(&g_scr_mu);
    if (p) /* the table is full: this stream goes without */
        (void)cudaFree(p);
}

void *kc_stream_scratch(cudaStream_t st)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    void *p = NULL;
    pthread_mutex_lock(&g_scr_mu);
    for (int i = 0; i < SCR_MAX && !p; i++)
        if (g_scr[i].p && g_scr[i].s == st && (st != NULL || g_scr[i].dev == dev))
            p = g_scr[i].p;
    pthread_mutex_unlock(&g_scr_mu);
    if (p || st != NULL)
        return p;
    if (cudaMalloc(&p, KC_STREAM_SCRATCH) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    scr_add(NULL, dev, p);
    return kc_stream_scratch(NULL); /* this one, or another thread's made at the same time */
}

int kcuda_stream_create(void **out, bl_err_t *err)
{
    cudaStream_t s = NULL;
    *out = NULL;
    int dev = 0;
    KCUDA_CHECK(cudaGetDevice(&dev), err);
    KCUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), err);
    void *p = NULL;
    const cudaError_t e = cudaMalloc(&p, KC_STREAM_SCRATCH);
    if (e != cudaSuccess) {
        (void)cudaStreamDestroy(s);
        KCUDA_CHECK(e, err);
    }
    scr_add(s, dev, p);
    *out = (void *)s;
    return 0;
}

void kcuda_stream_destroy(void *stream)
{
    if (!stream)
        return;
    void *p = NULL;
    pthread_mutex_lock(&g_scr_mu);
    for (int i = 0; i < SCR_MAX; i++)
        if (g_scr[i].p && g_scr[i].s == (cudaStream_t)stream) {
            p = g_scr[i].p;
            g_scr[i].p = NULL;
            g_scr[i].s = NULL;
        }
    pthread_mutex_unlock(&g_scr_mu);
    (void)cudaStreamDestroy((cudaStream_t)stream);
    if (p)
        (void)cudaFree(p); /* waits for the device, so nothing still reads it */
}

int kcuda_type_supported(uint32_t type)
{
    switch (type) {
    case BL_TYPE_F32: case BL_TYPE_F16: case BL_TYPE_BF16: case BL_TYPE_Q8_0:
    case BL_TYPE_Q4_K: case BL_TYPE_Q5_K: case BL_TYPE_Q6_K: case BL_TYPE_MXFP4:
        return 1;
    default:
        return 0;
    }
}

int kcuda_mat_init(kcuda_mat_t *m, const void *d_data, uint32_t type, int64_t ncols,
                   int64_t nrows, bl_err_t *err)
{
    const bl_type_info_t *ti = bl_type_info(type);
    if (!kcuda_type_supported(type))
        return bl_err_set(err, BL_ENOTSUP, "the CUDA kernels do not read weights of type %s",
                          ti ? ti->name : "?");
    if (nrows < 1 || nrows > INT32_MAX * (int64_t)64)
        return bl_err_set(err, BL_ERANGE, "a matrix of %lld rows", (long long)nrows);
    size_t rb = 0;
    const int rc = bl_row_bytes(type, ncols, &rb, err);
    if (rc < 0)
        return rc;
    if ((uintptr_t)d_data % 16 != 0)
        return bl_err_set(err, BL_EINVAL, "weight data at %p is not 16-byte aligned", d_data);
    m->data = d_data;
    m->type = type;
    m->ncols = ncols;
    m->nrows = nrows;
    m->row_bytes = rb;
    return 0;
}
