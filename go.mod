module github.com/manifoldlm/manifold

go 1.26.8

require github.com/x448/float16 v0.8.4

require (
	github.com/dlclark/regexp2 v1.12.0
	github.com/ebitengine/purego v0.11.3
	golang.org/x/sys v0.49.0
	golang.org/x/text v0.43.0
)
