package main

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestOpenAISDK drives the server with OpenAI's Go SDK: chat and text
// completions, whole and streamed (with usage and log-probabilities), the
// model list, and an error the SDK reads as an API error.
func TestOpenAISDK(t *testing.T) {
	ts := newTestServer(t, 4, 8)
	ctx := context.Background()
	client := openai.NewClient(option.WithBaseURL(ts.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))

	chat := openai.ChatCompletionNewParams{
		Model:       "tiny",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Hello there")},
		MaxTokens:   openai.Int(9),
		Temperature: openai.Float(0),
		Logprobs:    openai.Bool(true),
		TopLogprobs: openai.Int(2),
	}
	whole, err := client.Chat.Completions.New(ctx, chat)
	if err != nil {
		t.Fatal(err)
	}
	if len(whole.Choices) != 1 || whole.Choices[0].FinishReason != "length" || whole.Usage.CompletionTokens != 9 ||
		len(whole.Choices[0].Logprobs.Content) != 9 || len(whole.Choices[0].Logprobs.Content[0].TopLogprobs) != 2 {
		t.Errorf("chat: %+v", whole)
	}
	chat.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, chat)
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got, want := acc.Choices[0].Message.Content, whole.Choices[0].Message.Content; got != want || acc.Usage.CompletionTokens != 9 {
		t.Errorf("streamed chat %q (usage %+v), whole %q", got, acc.Usage, want)
	}

	comp := openai.CompletionNewParams{
		Model:       "tiny",
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("The quick brown")},
		MaxTokens:   openai.Int(6),
		Temperature: openai.Float(0),
		Seed:        openai.Int(3),
	}
	c, err := client.Completions.New(ctx, comp)
	if err != nil {
		t.Fatal(err)
	}
	cs := client.Completions.NewStreaming(ctx, comp)
	var text strings.Builder
	for cs.Next() {
		for _, ch := range cs.Current().Choices {
			text.WriteString(ch.Text)
		}
	}
	if err := cs.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != c.Choices[0].Text || c.Usage.CompletionTokens != 6 {
		t.Errorf("streamed completion %q, whole %q (usage %+v)", text.String(), c.Choices[0].Text, c.Usage)
	}

	models, err := client.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 1 || models.Data[0].ID != "tiny" {
		t.Errorf("models %+v", models.Data)
	}

	chat.Model = "gpt-unknown"
	_, err = client.Chat.Completions.New(ctx, chat)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("unknown model: %v", err)
	}
}
