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
// regexp2 backtracks, so a careless or malicious pattern such as (a+)+$
// takes time exponential in the text. Each regexp2 match is limited to 1 s
// (real patterns take microseconds); one that runs past it makes Encode,
// Decode or a StreamDecoder fail with an error naming the pattern and the
// tokenizer.json component using it, and that is the only error they
// return.
//
// The package owns tokenizer files only: it reads no weights and must not
// depend on the engine, model or kernel packages.
package tokenizer
