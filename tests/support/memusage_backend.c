/* A Triton backend for the placement tests: add_sub (FP32 INPUT0, INPUT1 -> OUTPUT0 = a + b,
 * OUTPUT1 = a - b) that reports the model's memory to Triton as the model config's
 * `memory_bytes` parameter says (and takes `load_delay_s` to load), so that Triton's statistics carry a `memory_usage` (the Python
 * backend reports none) and `capacity_bytes` can be proven against a real server.
 *
 * Built by tests/support/placement.py with the system C compiler, placed in each model's
 * directory as libtriton_memusage.so (Triton looks for a model's backend there first). The
 * TRITONBACKEND / TRITONSERVER functions it calls are resolved at load time from the
 * libtritonserver the server process already has loaded; their prototypes are declared here
 * from Triton's backend API documentation (core/include/triton/core/tritonbackend.h, API 1.19),
 * not included, so the test needs no Triton headers.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct TRITONSERVER_Error TRITONSERVER_Error;
typedef struct TRITONSERVER_Message TRITONSERVER_Message;
typedef struct TRITONSERVER_BufferAttributes TRITONSERVER_BufferAttributes;
typedef struct TRITONBACKEND_Model TRITONBACKEND_Model;
typedef struct TRITONBACKEND_ModelInstance TRITONBACKEND_ModelInstance;
typedef struct TRITONBACKEND_Request TRITONBACKEND_Request;
typedef struct TRITONBACKEND_Response TRITONBACKEND_Response;
typedef struct TRITONBACKEND_Input TRITONBACKEND_Input;
typedef struct TRITONBACKEND_Output TRITONBACKEND_Output;

enum { MEMORY_CPU = 0 };                        /* TRITONSERVER_MEMORY_CPU */
enum { TYPE_FP32 = 11 };                        /* TRITONSERVER_TYPE_FP32 */
enum { ERROR_INVALID_ARG = 3 };                 /* TRITONSERVER_ERROR_INVALID_ARG */
enum { RESPONSE_COMPLETE_FINAL = 1 };           /* TRITONSERVER_RESPONSE_COMPLETE_FINAL */
enum { REQUEST_RELEASE_ALL = 1 };               /* TRITONSERVER_REQUEST_RELEASE_ALL */

#define EXPORT __attribute__((visibility("default")))

extern TRITONSERVER_Error *TRITONSERVER_ErrorNew(int code, const char *msg);
extern void TRITONSERVER_ErrorDelete(TRITONSERVER_Error *error);
extern TRITONSERVER_Error *TRITONSERVER_MessageSerializeToJson(TRITONSERVER_Message *m, const char **base,
                                                               size_t *byte_size);
extern TRITONSERVER_Error *TRITONSERVER_MessageDelete(TRITONSERVER_Message *m);
extern TRITONSERVER_Error *TRITONSERVER_BufferAttributesNew(TRITONSERVER_BufferAttributes **a);
extern TRITONSERVER_Error *TRITONSERVER_BufferAttributesDelete(TRITONSERVER_BufferAttributes *a);
extern TRITONSERVER_Error *TRITONSERVER_BufferAttributesSetMemoryType(TRITONSERVER_BufferAttributes *a, int type);
extern TRITONSERVER_Error *TRITONSERVER_BufferAttributesSetMemoryTypeId(TRITONSERVER_BufferAttributes *a, int64_t id);
extern TRITONSERVER_Error *TRITONSERVER_BufferAttributesSetByteSize(TRITONSERVER_BufferAttributes *a, size_t size);
extern TRITONSERVER_Error *TRITONBACKEND_ModelConfig(TRITONBACKEND_Model *model, uint32_t version,
                                                     TRITONSERVER_Message **config);
extern TRITONSERVER_Error *TRITONBACKEND_ModelReportMemoryUsage(TRITONBACKEND_Model *model,
                                                                TRITONSERVER_BufferAttributes **usage,
                                                                uint32_t usage_size);
extern TRITONSERVER_Error *TRITONBACKEND_RequestInput(TRITONBACKEND_Request *r, const char *name,
                                                      TRITONBACKEND_Input **input);
extern TRITONSERVER_Error *TRITONBACKEND_InputProperties(TRITONBACKEND_Input *input, const char **name,
                                                         int *datatype, const int64_t **shape,
                                                         uint32_t *dims_count, uint64_t *byte_size,
                                                         uint32_t *buffer_count);
extern TRITONSERVER_Error *TRITONBACKEND_InputBuffer(TRITONBACKEND_Input *input, uint32_t index,
                                                     const void **buffer, uint64_t *buffer_byte_size,
                                                     int *memory_type, int64_t *memory_type_id);
extern TRITONSERVER_Error *TRITONBACKEND_ResponseNew(TRITONBACKEND_Response **response,
                                                     TRITONBACKEND_Request *request);
extern TRITONSERVER_Error *TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response *response,
                                                        TRITONBACKEND_Output **output, const char *name,
                                                        int datatype, const int64_t *shape, uint32_t dims_count);
extern TRITONSERVER_Error *TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output *output, void **buffer,
                                                      uint64_t byte_size, int *memory_type,
                                                      int64_t *memory_type_id);
extern TRITONSERVER_Error *TRITONBACKEND_ResponseSend(TRITONBACKEND_Response *response, uint32_t flags,
                                                      TRITONSERVER_Error *error);
extern TRITONSERVER_Error *TRITONBACKEND_RequestRelease(TRITONBACKEND_Request *request, uint32_t flags);
extern TRITONSERVER_Error *TRITONBACKEND_ModelInstanceReportStatistics(
    TRITONBACKEND_ModelInstance *instance, TRITONBACKEND_Request *request, bool success, uint64_t exec_start_ns,
    uint64_t compute_start_ns, uint64_t compute_end_ns, uint64_t exec_end_ns);
extern TRITONSERVER_Error *TRITONBACKEND_ModelInstanceReportBatchStatistics(
    TRITONBACKEND_ModelInstance *instance, uint64_t batch_size, uint64_t exec_start_ns, uint64_t compute_start_ns,
    uint64_t compute_end_ns, uint64_t exec_end_ns);

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* the clock Triton's own backends stamp statistics with */
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A numeric parameter's value in the model config's JSON
 * ("parameters":{"memory_bytes":{"string_value":"123"}}), 0 when absent. */
static double parameter(const char *json, size_t len, const char *key) {
    char *copy = malloc(len + 1);
    char quoted[64];
    double value = 0;
    if (copy == NULL) return 0;
    memcpy(copy, json, len);
    copy[len] = '\0';
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    const char *at = strstr(copy, quoted);
    if (at != NULL) at = strstr(at, "\"string_value\"");
    if (at != NULL) at = strchr(at + 14, '"');
    if (at != NULL) value = strtod(at + 1, NULL);
    free(copy);
    return value;
}

EXPORT TRITONSERVER_Error *TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model *model) {
    TRITONSERVER_Message *config = NULL;
    TRITONSERVER_Error *err = TRITONBACKEND_ModelConfig(model, 1, &config);
    if (err != NULL) return err;
    const char *json = NULL;
    size_t len = 0;
    err = TRITONSERVER_MessageSerializeToJson(config, &json, &len);
    uint64_t size = err == NULL ? (uint64_t)parameter(json, len, "memory_bytes") : 0;
    double delay = err == NULL ? parameter(json, len, "load_delay_s") : 0;
    TRITONSERVER_MessageDelete(config);
    if (err != NULL) return err;
    if (delay > 0) {  /* a load that takes a while, as a real model's does */
        struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
        nanosleep(&ts, NULL);
    }
    if (size == 0) return NULL;
    TRITONSERVER_BufferAttributes *usage = NULL;
    err = TRITONSERVER_BufferAttributesNew(&usage);
    if (err != NULL) return err;
    TRITONSERVER_BufferAttributesSetMemoryType(usage, MEMORY_CPU);
    TRITONSERVER_BufferAttributesSetMemoryTypeId(usage, 0);
    TRITONSERVER_BufferAttributesSetByteSize(usage, (size_t)size);
    err = TRITONBACKEND_ModelReportMemoryUsage(model, &usage, 1);
    TRITONSERVER_BufferAttributesDelete(usage);
    return err;
}

/* One FP32 input copied into `out` (at most `cap` values); its element count, or -1. */
static int64_t read_input(TRITONBACKEND_Request *request, const char *name, float *out, int64_t cap,
                          const int64_t **shape, uint32_t *dims) {
    TRITONBACKEND_Input *input = NULL;
    int datatype = 0;
    uint64_t byte_size = 0;
    uint32_t buffers = 0;
    if (TRITONBACKEND_RequestInput(request, name, &input) != NULL) return -1;
    if (TRITONBACKEND_InputProperties(input, NULL, &datatype, shape, dims, &byte_size, &buffers) != NULL) return -1;
    if (datatype != TYPE_FP32 || byte_size % 4 != 0 || (int64_t)(byte_size / 4) > cap) return -1;
    uint64_t at = 0;
    for (uint32_t i = 0; i < buffers; i++) {
        const void *buffer = NULL;
        uint64_t size = 0;
        int type = MEMORY_CPU;
        int64_t type_id = 0;
        if (TRITONBACKEND_InputBuffer(input, i, &buffer, &size, &type, &type_id) != NULL) return -1;
        if (type != MEMORY_CPU || at + size > byte_size) return -1;
        memcpy((char *)out + at, buffer, size);
        at += size;
    }
    return at == byte_size ? (int64_t)(byte_size / 4) : -1;
}

enum { MAX_VALUES = 4096 };

/* Answers one request (its result or its error); true when it succeeded. The error sent stays
 * the caller's to delete (tritonbackend.h, TRITONBACKEND_ResponseSend). */
static bool answer(TRITONBACKEND_Request *request) {
    static float a[MAX_VALUES], b[MAX_VALUES];  /* one execute at a time: instance_group count 1 */
    const int64_t *shape_a = NULL, *shape_b = NULL;
    uint32_t dims_a = 0, dims_b = 0;
    int64_t n = read_input(request, "INPUT0", a, MAX_VALUES, &shape_a, &dims_a);
    int64_t m = read_input(request, "INPUT1", b, MAX_VALUES, &shape_b, &dims_b);
    TRITONBACKEND_Response *response = NULL;
    TRITONSERVER_Error *err = TRITONBACKEND_ResponseNew(&response, request);
    if (err != NULL) {
        TRITONSERVER_ErrorDelete(err);
        return false;
    }
    if (n < 0 || m != n)
        err = TRITONSERVER_ErrorNew(ERROR_INVALID_ARG, "INPUT0 and INPUT1: FP32 of one size, at most 4096");
    const char *names[2] = {"OUTPUT0", "OUTPUT1"};
    for (int k = 0; k < 2 && err == NULL; k++) {
        TRITONBACKEND_Output *output = NULL;
        void *buffer = NULL;
        int type = MEMORY_CPU;
        int64_t type_id = 0;
        err = TRITONBACKEND_ResponseOutput(response, &output, names[k], TYPE_FP32, shape_a, dims_a);
        if (err == NULL) err = TRITONBACKEND_OutputBuffer(output, &buffer, (uint64_t)n * 4, &type, &type_id);
        if (err == NULL && type != MEMORY_CPU)
            err = TRITONSERVER_ErrorNew(ERROR_INVALID_ARG, "output buffer not in CPU memory");
        if (err == NULL) {
            float *values = buffer;
            for (int64_t i = 0; i < n; i++) values[i] = k == 0 ? a[i] + b[i] : a[i] - b[i];
        }
    }
    TRITONSERVER_Error *sent = TRITONBACKEND_ResponseSend(response, RESPONSE_COMPLETE_FINAL, err);
    bool ok = err == NULL && sent == NULL;
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
    if (sent != NULL) TRITONSERVER_ErrorDelete(sent);
    return ok;
}

EXPORT TRITONSERVER_Error *TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance *instance,
                                                              TRITONBACKEND_Request **requests,
                                                              const uint32_t request_count) {
    uint64_t start = now_ns();
    for (uint32_t r = 0; r < request_count; r++) {
        bool ok = answer(requests[r]);
        uint64_t end = now_ns();
        TRITONBACKEND_ModelInstanceReportStatistics(instance, requests[r], ok, start, start, end, end);
        TRITONBACKEND_RequestRelease(requests[r], REQUEST_RELEASE_ALL);
    }
    uint64_t end = now_ns();
    TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, request_count, start, start, end, end);
    return NULL;
}
