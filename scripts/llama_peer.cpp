// llama_peer: a minimal timing driver over llama.cpp's C API (llama.h), the llama.cpp peer of
// scripts/bench_peers.py and scripts/bench_load.py when no llama-bench / llama-completion binary
// is at hand (they need llama.cpp's `common` library; this needs only libllama + ggml).
//
// Build against a llama.cpp source tree SRC whose libraries were built into BUILD, e.g.
//   cmake -S SRC -B BUILD -DGGML_NATIVE=OFF -DGGML_AVX512=ON ... && cmake --build BUILD --target llama
//   g++ -O2 -std=c++17 scripts/llama_peer.cpp -I SRC/include -I SRC/ggml/include
//       BUILD/src/libllama.a BUILD/ggml/src/libggml.a BUILD/ggml/src/libggml-cpu.a
//       BUILD/ggml/src/libggml-base.a -fopenmp -lpthread -ldl -o llama_peer    (one line)
//
// Modes (all greedy, one sequence, weights memory-mapped as llama.cpp does by default):
//   llama_peer serve MODEL THREADS
//       reads lines "N_GEN,ID,ID,..." on stdin (comma-separated: the number of tokens to
//       generate, then the prompt's token ids); for each line: clears the KV cache, decodes
//       the prompt as one batch (prefill), then N_GEN greedy tokens one at a time,
//       then a 5-token batch and a 1-token step on top (rolled back); prints one JSON line
//       {"prefill_s", "decode_s", "n_prompt", "n_gen", "forward5_s", "step1_s"}. decode_s spans
//       the first generated token to the last (N_GEN - 1 steps), as bench_peers.py times
//       localchat. An empty line or EOF ends it.
//   llama_peer ask MODEL THREADS N_CTX N_GEN PROMPT
//       what a user's one-shot CLI run does: load, apply the model's chat template to PROMPT,
//       tokenize, decode, N_GEN greedy tokens (stops at end of generation), print the reply;
//       then one JSON line on stderr {"load_s", "n_prompt", "n_gen"}.
//   llama_peer top1 MODEL THREADS ID,ID,...
//       teacher-forced: the ids decoded as one batch with logits at every position; prints
//       one line, the argmax token of each position, comma-separated (position i predicts
//       token i + 1), for bench_load.py's top-1 agreement against the same oracle.
// Errors: one line on stderr, exit 1.

#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

static double now_s() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

static void quiet_log(ggml_log_level, const char *, void *) {}

static llama_token argmax_last(llama_context * ctx, int n_vocab) {
    const float * logits = llama_get_logits_ith(ctx, -1);
    int best = 0;
    for (int i = 1; i < n_vocab; i++) {
        if (logits[i] > logits[best]) best = i;
    }
    return best;
}

// Decodes toks in batches of at most the context's n_batch tokens (llama_decode aborts on a
// longer one), as llama.cpp's own tools split a long prompt.
static int decode(llama_context * ctx, std::vector<llama_token> & toks) {
    const int step = (int) llama_n_batch(ctx);
    for (size_t i = 0; i < toks.size(); i += step) {
        const int n = (int) std::min(toks.size() - i, (size_t) step);
        if (int rc = llama_decode(ctx, llama_batch_get_one(toks.data() + i, n))) return rc;
    }
    llama_synchronize(ctx);
    return 0;
}

static llama_model * load(const char * path) {
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(path, mp);
    if (!model) {
        fprintf(stderr, "llama_peer: error: cannot load %s\n", path);
        exit(1);
    }
    return model;
}

static llama_context * context(llama_model * model, int threads, int n_ctx) {
    llama_context_params cp = llama_context_default_params();  // n_batch 2048, n_ubatch 512
    cp.n_ctx = n_ctx;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama_peer: error: cannot create a context of %d tokens\n", n_ctx);
        exit(1);
    }
    return ctx;
}

static int serve(const char * path, int threads) {
    llama_model * model = load(path);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    llama_context * ctx = nullptr;
    int ctx_len = 0;
    std::string line;
    while (std::getline(std::cin, line) && !line.empty()) {
        std::vector<llama_token> prompt;
        std::stringstream ss(line);
        std::string item;
        while (std::getline(ss, item, ',')) prompt.push_back(std::atoi(item.c_str()));
        if (prompt.size() < 2 || prompt[0] < 1) {
            fprintf(stderr, "llama_peer: error: want a line N_GEN,ID,ID,...\n");
            return 1;
        }
        const int n_gen = prompt[0];
        prompt.erase(prompt.begin());
        const int need = (int) prompt.size() + n_gen + 8;
        if (need > ctx_len) {  // one context of at least 4096 tokens, kept across lines
            if (ctx) llama_free(ctx);
            ctx_len = need > 4096 ? need : 4096;
            ctx = context(model, threads, ctx_len);
        }
        llama_memory_clear(llama_get_memory(ctx), true);
        const double t0 = now_s();
        if (decode(ctx, prompt) != 0) {
            fprintf(stderr, "llama_peer: error: prompt decode failed\n");
            return 1;
        }
        llama_token tok = argmax_last(ctx, n_vocab);
        const double t1 = now_s();
        double t_last = t1;
        for (int i = 1; i < n_gen; i++) {
            std::vector<llama_token> one{tok};
            if (decode(ctx, one) != 0) {
                fprintf(stderr, "llama_peer: error: decode failed\n");
                return 1;
            }
            tok = argmax_last(ctx, n_vocab);
            t_last = now_s();
        }
        // a 5-token forward (what verifying 4 drafts costs) and a 1-token step, both rolled back
        const llama_pos end = llama_memory_seq_pos_max(llama_get_memory(ctx), 0) + 1;
        std::vector<llama_token> five(5, tok), one{tok};
        double f0 = now_s();
        decode(ctx, five);
        double f1 = now_s();
        llama_memory_seq_rm(llama_get_memory(ctx), 0, end, -1);
        double s0 = now_s();
        decode(ctx, one);
        double s1 = now_s();
        llama_memory_seq_rm(llama_get_memory(ctx), 0, end, -1);
        printf("{\"prefill_s\": %.6f, \"decode_s\": %.6f, \"n_prompt\": %zu, \"n_gen\": %d, "
               "\"forward5_s\": %.6f, \"step1_s\": %.6f}\n",
               t1 - t0, t_last - t1, prompt.size(), n_gen, f1 - f0, s1 - s0);
        fflush(stdout);
    }
    if (ctx) llama_free(ctx);
    llama_model_free(model);
    return 0;
}

static int ask(const char * path, int threads, int n_ctx, int n_gen, const char * text) {
    const double t0 = now_s();
    llama_model * model = load(path);
    llama_context * ctx = context(model, threads, n_ctx);
    const double t_load = now_s() - t0;
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    llama_chat_message msg{"user", text};
    const char * tmpl = llama_model_chat_template(model, nullptr);
    std::vector<char> buf(4 * std::strlen(text) + 4096);
    int n = llama_chat_apply_template(tmpl, &msg, 1, true, buf.data(), (int32_t) buf.size());
    if (n < 0 || n > (int) buf.size()) {
        fprintf(stderr, "llama_peer: error: the model's chat template is not supported\n");
        return 1;
    }
    std::vector<llama_token> toks(n + 16);
    int nt = llama_tokenize(vocab, buf.data(), n, toks.data(), (int32_t) toks.size(), true, true);
    if (nt < 0) {
        fprintf(stderr, "llama_peer: error: tokenize failed\n");
        return 1;
    }
    toks.resize(nt);
    if (nt + n_gen > n_ctx) {
        fprintf(stderr, "llama_peer: error: prompt of %d tokens does not fit %d\n", nt, n_ctx);
        return 1;
    }
    if (decode(ctx, toks) != 0) {
        fprintf(stderr, "llama_peer: error: prompt decode failed\n");
        return 1;
    }
    int produced = 0;
    std::string reply;
    for (; produced < n_gen; produced++) {
        llama_token tok = argmax_last(ctx, n_vocab);
        if (llama_vocab_is_eog(vocab, tok)) break;
        char piece[256];
        int len = llama_token_to_piece(vocab, tok, piece, sizeof(piece), 0, false);
        if (len > 0) reply.append(piece, len);
        std::vector<llama_token> one{tok};
        if (produced + 1 < n_gen && decode(ctx, one) != 0) {
            fprintf(stderr, "llama_peer: error: decode failed\n");
            return 1;
        }
    }
    printf("%s\n", reply.c_str());
    fprintf(stderr, "{\"load_s\": %.6f, \"n_prompt\": %d, \"n_gen\": %d}\n", t_load, nt, produced);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}

static int top1(const char * path, int threads, const char * ids) {
    std::vector<llama_token> toks;
    std::stringstream ss(ids);
    std::string item;
    while (std::getline(ss, item, ',')) toks.push_back(std::atoi(item.c_str()));
    const int n = (int) toks.size();
    if (n < 1 || n > 512) {
        fprintf(stderr, "llama_peer: error: want 1 to 512 comma-separated token ids\n");
        return 1;
    }
    llama_model * model = load(path);
    llama_context * ctx = context(model, threads, 1024);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = toks[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "llama_peer: error: decode failed\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        const float * logits = llama_get_logits_ith(ctx, i);
        int best = 0;
        for (int v = 1; v < n_vocab; v++) {
            if (logits[v] > logits[best]) best = v;
        }
        printf(i ? ",%d" : "%d", best);
    }
    printf("\n");
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: llama_peer serve MODEL THREADS | "
                        "ask MODEL THREADS N_CTX N_GEN PROMPT | top1 MODEL THREADS IDS\n");
        return 2;
    }
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    const std::string mode = argv[1];
    int rc = 2;
    if (mode == "serve" && argc == 4) {
        rc = serve(argv[2], std::atoi(argv[3]));
    } else if (mode == "ask" && argc == 7) {
        rc = ask(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), argv[6]);
    } else if (mode == "top1" && argc == 5) {
        rc = top1(argv[2], std::atoi(argv[3]), argv[4]);
    } else {
        fprintf(stderr, "llama_peer: error: bad arguments (see the header of llama_peer.cpp)\n");
    }
    llama_backend_free();
    return rc;
}
