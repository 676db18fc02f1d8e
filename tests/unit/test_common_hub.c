/* Tests of common/hub.c without a network: the names -hf accepts, the paths the hub
 * may list, split parts, the choice of a file by quant tag, the cache folder and the
 * snapshot links. Downloads are tested against a stand-in hub in
 * tests/integration/test_hub.py. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "../../common/hub.c"

static void test_hub_repo_ids(void **state)
{
    (void)state;
    assert_true(valid_repo_id("Qwen/Qwen3-30B-A3B-GGUF"));
    assert_true(valid_repo_id("unsloth/gpt-oss-20b-GGUF"));
    assert_true(valid_repo_id("a_b/c.d"));
    assert_false(valid_repo_id(""));
    assert_false(valid_repo_id("noslash"));
    assert_false(valid_repo_id("a/b/c"));
    assert_false(valid_repo_id("/a"));
    assert_false(valid_repo_id("a/"));
    assert_false(valid_repo_id("a//b"));
    assert_false(valid_repo_id("a/../b"));
    assert_false(valid_repo_id("../a"));
    assert_false(valid_repo_id("a/b-"));
    assert_false(valid_repo_id("a b/c"));
    assert_false(valid_repo_id("a/b?x=1"));
    char big[300];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    big[5] = '/';
    assert_false(valid_repo_id(big));
}

static void test_hub_spec_splits_repo_and_tag(void **state)
{
    (void)state;
    char repo[HUB_REPO_MAX + 1], tag[HUB_TAG_MAX + 1];
    bl_err_t err = {0};
    assert_int_equal(parse_spec("user/model:Q4_K_M", repo, tag, &err), 0);
    assert_string_equal(repo, "user/model");
    assert_string_equal(tag, "Q4_K_M");
    assert_int_equal(parse_spec("user/model", repo, tag, &err), 0);
    assert_string_equal(tag, "");
    assert_int_equal(parse_spec("user/model:", repo, tag, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "quant"));
    assert_int_equal(parse_spec("user/model:Q4/x", repo, tag, &err), BL_EINVAL);
    assert_int_equal(parse_spec("usermodel:Q8_0", repo, tag, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "USER/MODEL"));
    assert_int_equal(parse_spec("user/model:a:b", repo, tag, &err), BL_EINVAL);
}

static void test_hub_paths_from_the_hub_stay_inside(void **state)
{
    (void)state;
    assert_true(valid_relpath("model-Q4_K_M.gguf"));
    assert_true(valid_relpath("BF16/model-BF16-00001-of-00002.gguf"));
    assert_true(valid_relpath(".gitattributes"));
    assert_true(valid_relpath("a/..b/c"));
    assert_false(valid_relpath(""));
    assert_false(valid_relpath("/etc/passwd"));
    assert_false(valid_relpath("../x.gguf"));
    assert_false(valid_relpath("a/../../x"));
    assert_false(valid_relpath("a/./b"));
    assert_false(valid_relpath("a//b"));
    assert_false(valid_relpath("a/"));
    assert_false(valid_relpath(".."));
    assert_false(valid_relpath("a\\b"));
    assert_false(valid_relpath("a\nb"));
}

static void test_hub_split_parts(void **state)
{
    (void)state;
    size_t pl;
    int index, count;
    assert_int_equal(split_info("m-Q8_0.gguf", &pl, &index, &count), 1);
    assert_int_equal(index, 1);
    assert_int_equal(count, 1);
    assert_int_equal(pl, strlen("m-Q8_0"));
    assert_int_equal(split_info("d/m-Q8_0-00002-of-00003.gguf", &pl, &index, &count), 1);
    assert_int_equal(index, 2);
    assert_int_equal(count, 3);
    assert_int_equal(pl, strlen("d/m-Q8_0"));
    assert_int_equal(split_info("m-00004-of-00003.gguf", &pl, &index, &count), 1);
    assert_int_equal(index, 0); /* malformed: never a model */
    assert_int_equal(split_info("README.md", &pl, &index, &count), 0);
    assert_true(is_model_gguf("m-Q8_0.GGUF"));
    assert_false(is_model_gguf("mmproj-m-F16.gguf"));
    assert_false(is_model_gguf("imatrix.gguf"));
    assert_false(is_model_gguf("m-00004-of-00003.gguf"));
}

static void test_hub_tag_needs_word_edges(void **state)
{
    (void)state;
    assert_true(tag_matches("Qwen3-30B-A3B-Q4_K_M.gguf", "Q4_K_M"));
    assert_true(tag_matches("Qwen3-30B-A3B-q4_k_m.gguf", "Q4_K_M"));
    assert_true(tag_matches("Q8_0/m-Q8_0-00001-of-00002.gguf", "Q8_0"));
    assert_false(tag_matches("Qwen3-IQ4_K_M.gguf", "Q4_K_M"));
    assert_false(tag_matches("Qwen3-Q4_K_M_L.gguf", "Q4_K_M"));
    assert_false(tag_matches("Qwen3-Q4_K_Mx.gguf", "Q4_K_M"));
}

static void list_of(hub_list_t *l, const char *const *paths)
{
    bl_err_t err = {0};
    for (; *paths; paths++)
        assert_int_equal(list_push(l, *paths, NULL, 0, 0, NULL, &err), 0);
}

static const char *picked(const hub_list_t *l, const char *tag, const char *file, bl_err_t *err)
{
    long i = pick_file(l, "u/m", tag, file, err);
    return i < 0 ? NULL : l->v[i].path;
}

static void test_hub_picks_quant_defaults_and_first_parts(void **state)
{
    (void)state;
    static const char *const files[] = {"README.md",
                                        "mmproj-m-Q4_K_M.gguf",
                                        "m-Q2_K.gguf",
                                        "m-Q8_0.gguf",
                                        "big/m-Q4_K_M-00002-of-00002.gguf",
                                        "big/m-Q4_K_M-00001-of-00002.gguf",
                                        NULL};
    hub_list_t l = {0};
    bl_err_t err = {0};
    list_of(&l, files);
    /* no tag: Q4_K_M first (its first part, not the projector), then Q8_0 */
    assert_string_equal(picked(&l, "", NULL, &err), "big/m-Q4_K_M-00001-of-00002.gguf");
    assert_string_equal(picked(&l, "q8_0", NULL, &err), "m-Q8_0.gguf");
    assert_string_equal(picked(&l, "Q2_K", NULL, &err), "m-Q2_K.gguf");
    assert_string_equal(picked(&l, "", "M-Q2_K.gguf", &err), "m-Q2_K.gguf");
    assert_null(picked(&l, "Q5_K_M", NULL, &err));
    assert_int_equal(err.code, BL_ENOENT);
    assert_non_null(strstr(err.msg, "Q5_K_M"));
    assert_non_null(strstr(err.msg, "m-Q8_0.gguf")); /* the list of what there is */
    assert_null(picked(&l, "", "nope.gguf", &err));
    assert_non_null(strstr(err.msg, "nope.gguf"));

    size_t *parts = NULL;
    int n = 0;
    long first = pick_file(&l, "u/m", "", NULL, &err);
    assert_int_equal(gather_parts(&l, (size_t)first, &parts, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(l.v[parts[0]].path, "big/m-Q4_K_M-00001-of-00002.gguf");
    assert_string_equal(l.v[parts[1]].path, "big/m-Q4_K_M-00002-of-00002.gguf");
    free(parts);
    list_free(&l);

    /* no Q4_K_M, no Q8_0: the first model GGUF; none at all: an error */
    static const char *const others[] = {"mmproj-F16.gguf", "m-F16.gguf", NULL};
    list_of(&l, others);
    assert_string_equal(picked(&l, "", NULL, &err), "m-F16.gguf");
    list_free(&l);
    static const char *const none[] = {"mmproj-F16.gguf", "x.safetensors", NULL};
    list_of(&l, none);
    assert_null(picked(&l, "", NULL, &err));
    assert_non_null(strstr(err.msg, "no GGUF model"));
    list_free(&l);
}

static void test_hub_refuses_a_split_model_with_a_missing_part(void **state)
{
    (void)state;
    static const char *const files[] = {"m-Q8_0-00001-of-00003.gguf", "m-Q8_0-00003-of-00003.gguf",
                                        NULL};
    hub_list_t l = {0};
    bl_err_t err = {0};
    list_of(&l, files);
    size_t *parts = NULL;
    int n = 0;
    long first = pick_file(&l, "u/m", "Q8_0", NULL, &err);
    assert_true(first >= 0);
    assert_int_equal(gather_parts(&l, (size_t)first, &parts, &n, &err), BL_ENOENT);
    assert_non_null(strstr(err.msg, "part 2 of 3"));
    assert_null(parts);
    list_free(&l);
}

static void test_hub_cache_folder_order(void **state)
{
    (void)state;
    char buf[PATH_MAX];
    bl_err_t err = {0};
    static const char *const vars[] = {"LLAMA_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                                       "HF_HOME", "XDG_CACHE_HOME", "HOME"};
    char *saved[6];
    for (int i = 0; i < 6; i++) {
        const char *v = getenv(vars[i]);
        saved[i] = v ? strdup(v) : NULL;
        unsetenv(vars[i]);
    }
    assert_int_equal(cache_root(buf, sizeof buf, &err), BL_ENOENT);
    setenv("HOME", "/h", 1);
    assert_int_equal(cache_root(buf, sizeof buf, &err), 0);
    assert_string_equal(buf, "/h/.cache/huggingface/hub");
    setenv("XDG_CACHE_HOME", "/x", 1);
    assert_int_equal(cache_root(buf, sizeof buf, &err), 0);
    assert_string_equal(buf, "/x/huggingface/hub");
    setenv("HF_HOME", "/hf", 1);
    assert_int_equal(cache_root(buf, sizeof buf, &err), 0);
    assert_string_equal(buf, "/hf/hub");
    setenv("HF_HUB_CACHE", "/hub", 1);
    assert_int_equal(cache_root(buf, sizeof buf, &err), 0);
    assert_string_equal(buf, "/hub");
    setenv("LLAMA_CACHE", "/llama", 1);
    assert_int_equal(cache_root(buf, sizeof buf, &err), 0);
    assert_string_equal(buf, "/llama");
    for (int i = 0; i < 6; i++) {
        if (saved[i])
            setenv(vars[i], saved[i], 1);
        else
            unsetenv(vars[i]);
        free(saved[i]);
    }
}

static void test_hub_options_refused_together(void **state)
{
    (void)state;
    bl_err_t err = {0};
    char *path = (char *)1;
    bl_hub_opts_t o = {.spec = "u/m"};
    assert_int_equal(bl_hub_model_path(&o, "x.gguf", &path, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "not both"));
    assert_null(path);
    o = (bl_hub_opts_t){.file = "m.gguf"};
    assert_int_equal(bl_hub_model_path(&o, "x.gguf", &path, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "--hf-file"));
    o = (bl_hub_opts_t){0};
    assert_int_equal(bl_hub_model_path(&o, "x.gguf", &path, &err), 0);
    assert_string_equal(path, "x.gguf");
    free(path);
    assert_int_equal(bl_hub_model_path(&o, NULL, &path, &err), 0);
    assert_null(path);
    o = (bl_hub_opts_t){.spec = "u/m", .token = "bad token"};
    assert_int_equal(bl_hub_resolve(&o, &path, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "--hf-token"));
    setenv("MODEL_ENDPOINT", "ftp://example", 1);
    o = (bl_hub_opts_t){.spec = "u/m"};
    assert_int_equal(bl_hub_resolve(&o, &path, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "endpoint"));
    unsetenv("MODEL_ENDPOINT");
}

/* Offline, the cache alone: refs/main names the snapshot whose links are the files. */
static void test_hub_offline_uses_the_snapshot(void **state)
{
    (void)state;
    char root[] = "/tmp/bl_test_hub_XXXXXX";
    assert_non_null(mkdtemp(root));
    char *saved = getenv("LLAMA_CACHE") ? strdup(getenv("LLAMA_CACHE")) : NULL;
    setenv("LLAMA_CACHE", root, 1);
    bl_err_t err = {0};
    char *path = NULL;
    bl_hub_opts_t o = {.spec = "u/m:Q8_0", .offline = 1};
    assert_int_equal(bl_hub_resolve(&o, &path, &err), BL_ENOENT);
    assert_non_null(strstr(err.msg, "--offline"));
    assert_non_null(strstr(err.msg, "not in the cache"));

    /* a snapshot as a download leaves it */
    static const char commit[] = "0123456789abcdef0123456789abcdef01234567";
    static const char oid[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    char p[PATH_MAX], final[PATH_MAX];
    snprintf(p, sizeof p, "%s/models--u--m/refs/main", root);
    assert_int_equal(write_small(p, commit, &err), 0);
    snprintf(p, sizeof p, "%s/models--u--m/blobs/%s", root, oid);
    assert_int_equal(write_small(p, "GGUF", &err), 0);
    snprintf(final, sizeof final, "%s/models--u--m/snapshots/%s/q/m-Q8_0.gguf", root, commit);
    assert_int_equal(link_blob(p, final, "q/m-Q8_0.gguf", oid, &err), 0);
    char target[PATH_MAX] = "";
    assert_true(readlink(final, target, sizeof target - 1) > 0);
    assert_string_equal(target, "../../../blobs/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");

    assert_int_equal(bl_hub_resolve(&o, &path, &err), 0);
    assert_string_equal(path, final);
    free(path);
    o.spec = "u/m:Q4_K_M";
    assert_int_equal(bl_hub_resolve(&o, &path, &err), BL_ENOENT);
    assert_non_null(strstr(err.msg, "q/m-Q8_0.gguf"));

    /* a dangling link (its blob gone) is not a cached file */
    unlink(p);
    o.spec = "u/m:Q8_0";
    assert_int_equal(bl_hub_resolve(&o, &path, &err), BL_ENOENT);

    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    assert_int_equal(system(cmd), 0);
    if (saved)
        setenv("LLAMA_CACHE", saved, 1);
    else
        unsetenv("LLAMA_CACHE");
    free(saved);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hub_repo_ids),
        cmocka_unit_test(test_hub_spec_splits_repo_and_tag),
        cmocka_unit_test(test_hub_paths_from_the_hub_stay_inside),
        cmocka_unit_test(test_hub_split_parts),
        cmocka_unit_test(test_hub_tag_needs_word_edges),
        cmocka_unit_test(test_hub_picks_quant_defaults_and_first_parts),
        cmocka_unit_test(test_hub_refuses_a_split_model_with_a_missing_part),
        cmocka_unit_test(test_hub_cache_folder_order),
        cmocka_unit_test(test_hub_options_refused_together),
        cmocka_unit_test(test_hub_offline_uses_the_snapshot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
