//go:build tools

// Package main pins the modules prefixlb uses so that go mod tidy keeps them while packages land.
package main

import (
	_ "github.com/HdrHistogram/hdrhistogram-go"
	_ "github.com/VictoriaMetrics/metrics"
	_ "github.com/cespare/xxhash/v2"
	_ "github.com/schollz/progressbar/v3"
	_ "github.com/spf13/cobra"
	_ "github.com/valyala/fasthttp"
	_ "github.com/valyala/fastjson"
	_ "go.uber.org/zap"
	_ "gonum.org/v1/plot"
	_ "gopkg.in/yaml.v3"
)
