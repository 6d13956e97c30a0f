// The training text of MakeSmallByteLevelTokenizer(): English prose and a little code, written for
// Tandem. Changing it changes every generated tokenizer (and so every generated model's ids).
#include "common/tokenizer/small_tokenizer.h"

namespace tandem {

const char kSmallTokenizerCorpus[] = R"corpus(The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran into the forest.
A tokenizer turns text into numbers, and the model turns numbers into more numbers. Then the
tokenizer turns those numbers back into text. If the two directions do not agree, the model reads
one thing and writes another, and nobody is happy.

When the weather is cold, the river freezes and the children skate on it. In the spring the ice
breaks, the water rises, and the old mill starts to turn again. My grandmother said that the mill
had been there for three hundred years; my grandfather said it was closer to ninety. They were
both wrong, but they enjoyed the argument more than they would have enjoyed the answer.

I'm sure you'll agree that it's better to test the code than to trust it. We've seen what happens
otherwise: the server starts, the first request works, and the second one doesn't. They'd rather
ship on Friday; we'd rather sleep on Saturday. DON'T PANIC, as the book says.

Questions and answers:
Q: What is a mixture of experts?
A: A layer with many small feed-forward networks, called experts, and a router that picks a few of
them for each token. Only the chosen experts run, so the model can be large while each token costs
little. The hard part is that the experts that are needed change from token to token.
Q: Why does the server keep some experts on the host?
A: Because the whole model does not fit in the memory of the GPU. The experts that are used most
often stay on the GPU, and the others are computed on the host or copied over when they are needed.

Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 16 32 64 128 256 512 1024 2048 4096 8192 65536 3.14159 2.71828
Dates: 2024-01-15, 2025-06-30, 1999-12-31. Prices: $19.99, $5, 42%. Ratios: 3:2, 16:9, 4:3.

Other languages: café, naïve, résumé, façade, über, niño, smørbrød, Zürich, São Paulo, Kraków.

```cpp
#include <cstdint>
#include <string>
#include <vector>

namespace example {

// Returns the sum of the values, or zero for an empty vector.
int64_t Sum(const std::vector<int32_t>& values) {
  int64_t total = 0;
  for (int32_t value : values) {
    total += value;
  }
  return total;
}

class Counter {
 public:
  explicit Counter(int start) : count_(start) {}
  void Increment() { ++count_; }
  int count() const { return count_; }

 private:
  int count_ = 0;
};

}  // namespace example
```

```python
def word_counts(text):
    """Counts how often each word occurs in the text."""
    counts = {}
    for word in text.split():
        word = word.strip(".,;:!?").lower()
        if not word:
            continue
        counts[word] = counts.get(word, 0) + 1
    return counts


if __name__ == "__main__":
    result = word_counts("the cat and the hat and the bat")
    for word, count in sorted(result.items()):
        print(f"{word}: {count}")
```

```json
{"model": "tandem-small", "layers": 4, "experts": 8, "top_k": 2, "vocab_size": 512,
 "messages": [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi there."}]}
```

The end of a story is often the beginning of another one. The fox came back the next day, and the
dog was waiting for it. This time the dog jumped first, and they both fell into the river. They
climbed out, shook off the water, and went home to dry in the sun. The end.

How the server works, in short: a request arrives with a prompt. The prompt is formatted as a chat,
turned into tokens, and placed in a queue. The scheduler takes requests from the queue, decides how
many tokens each one may process in the next step, and hands the batch to the engine. The engine
runs the layers one after another. For every layer, the router chooses experts for every token;
experts that live on the GPU run there, and the rest are sent to the worker on the host, which
computes them with its own threads and sends the results back. When the last layer is done, the
engine samples the next token of every request, checks the stop conditions, and streams the new
text to the client.

Good tests are small, fast, and exact. A test that cannot fail is worse than no test at all,
because it tells you something that is not true. Write the expected value by hand when you can;
when you cannot, compute it another way and say so.

```rust
use std::collections::HashMap;

fn most_common(words: &[&str]) -> Option<(String, usize)> {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for word in words {
        *counts.entry(word.to_lowercase()).or_insert(0) += 1;
    }
    counts.into_iter().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
}
```

```bash
#!/usr/bin/env bash
set -euo pipefail
for file in "$@"; do
  if [[ -f "$file" ]]; then
    echo "checking $file"
    grep -n "TODO" "$file" || true
  fi
done
```

## Notes

- Keep each file small and give it one job.
- Return an error instead of crashing; name the field that was wrong.
- Measure before you optimize, and write down what you measured.

Monday: write the plan. Tuesday: build the parts. Wednesday: test them. Thursday: fix what broke.
Friday: write the report, and then, if there is time left, rest.
)corpus";

}  // namespace tandem
