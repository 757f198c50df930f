module github.com/manifoldlm/manifold/weights/internal/stcompare

go 1.26.8

replace github.com/manifoldlm/manifold => ../../..

require (
	github.com/manifoldlm/manifold v0.0.0-00010101000000-000000000000
	github.com/nlpodyssey/safetensors v0.0.0-20250209183917-bfb01cc25f7c
)

require (
	github.com/x448/float16 v0.8.4 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
