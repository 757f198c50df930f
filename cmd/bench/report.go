package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// formatBytes is a byte count in decimal units (the bandwidths' GB/s).
func formatBytes(b float64) string {
	for _, u := range []struct {
		unit  string
		scale float64
	}{{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"kB", 1e3}} {
		if b >= u.scale {
			return fmt.Sprintf("%.2f %s", b/u.scale, u.unit)
		}
	}
	return fmt.Sprintf("%.0f B", b)
}

func writeJSON(w io.Writer, results []result) error {
	if results == nil {
		results = []result{}
	}
	data, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", data)
	return err
}

// writeText writes lines on the model, the load and the floor's parts, then
// a markdown table with a row per test, as llama-bench prints.
func writeText(w io.Writer, results []result) error {
	if len(results) == 0 {
		return nil
	}
	var sb strings.Builder
	r0 := results[0]
	if r0.Random {
		fmt.Fprintf(&sb, "model:     %s, random: %s (%s)\n", r0.Model, r0.Description, r0.Dir)
	} else {
		fmt.Fprintf(&sb, "model:     %s (%s)\n", r0.Model, r0.Dir)
	}
	fmt.Fprintf(&sb, "loaded:    in %s on %s\n", time.Duration(r0.LoadSeconds*1e9).Round(time.Millisecond/10), r0.Device)
	if r0.CopyBandwidth > 0 {
		fmt.Fprintf(&sb, "copy:      %.1f GB/s, bytes read + written (%s)\n", r0.CopyBandwidth/1e9, r0.copyDescription)
	} else {
		fmt.Fprintf(&sb, "copy:      not measured\n")
	}
	for _, r := range results {
		if r.BytesPerToken == 0 {
			continue
		}
		experts := ""
		if r.RoutedExperts != "" {
			experts = ", " + r.RoutedExperts
		}
		fmt.Fprintf(&sb, "%-10s %s read per decoded token = weights %s%s + embedding row %s + KV cache %s (%s a position x mean context %.1f)\n",
			r.Test+":", formatBytes(float64(r.BytesPerToken)), formatBytes(float64(r.WeightBytes)), experts,
			formatBytes(float64(r.EmbedRowBytes)), formatBytes(float64(r.KVBytes)), formatBytes(float64(r.KVBytesPerPos)), r.MeanContext)
	}
	sb.WriteString("\n")
	header := []string{"model", "type", "size", "device", "test", "t/s", "B/tok", "floor t/s", "of floor"}
	right := []bool{false, false, true, false, true, true, true, true, true}
	rows := [][]string{header}
	for _, r := range results {
		tps := fmt.Sprintf("%.2f ± %.2f", r.TokS, r.Stddev)
		bpt, floor, share := "", "", ""
		if r.BytesPerToken > 0 {
			bpt = formatBytes(float64(r.BytesPerToken))
		}
		if r.FloorTokS > 0 {
			floor, share = fmt.Sprintf("%.2f", r.FloorTokS), fmt.Sprintf("%.1f%%", 100*r.FloorShare)
		}
		rows = append(rows, []string{r.Model, fmt.Sprintf("%s %dL", r.ModelType, r.Layers), formatBytes(float64(r.SizeBytes)),
			r.Device, r.Test, tps, bpt, floor, share})
	}
	width := make([]int, len(header))
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	line := func(cells []string) {
		sb.WriteString("|")
		for i, c := range cells {
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if right[i] {
				fmt.Fprintf(&sb, " %s%s |", pad, c)
			} else {
				fmt.Fprintf(&sb, " %s%s |", c, pad)
			}
		}
		sb.WriteString("\n")
	}
	line(rows[0])
	sep := make([]string, len(header))
	for i := range sep {
		if right[i] {
			sep[i] = strings.Repeat("-", width[i]-1) + ":"
		} else {
			sep[i] = strings.Repeat("-", width[i])
		}
	}
	line(sep)
	for _, row := range rows[1:] {
		line(row)
	}
	_, err := io.WriteString(w, sb.String())
	return err
}
