// Package tokenizer turns text into token ids and back for the models the
// engine runs: it loads HuggingFace tokenizer.json files (BPE models with
// byte-level or SentencePiece-style pre-processing, added and special
// tokens, normalizers, pre-tokenizers, post-processors and decoders),
// decodes ids, streams decoded text at UTF-8 boundaries, and renders the
// chat template of tokenizer_config.json with a strict Jinja subset.
//
// Encode and Decode are meant to match the HuggingFace tokenizers library
// (Rust) exactly. Pre-tokenizer regexes of the known model families run as
// hand-written scanners checked against a general regex engine
// (github.com/dlclark/regexp2), which handles any other pattern.
//
// The package owns tokenizer files only: it reads no weights and must not
// depend on the engine, model or kernel packages.
package tokenizer
