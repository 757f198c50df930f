module github.com/manifoldlm/manifold

go 1.26.8

require github.com/x448/float16 v0.8.4
