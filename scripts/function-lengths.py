import re,sys,pathlib
res=[]
for f in pathlib.Path('.').glob('*/src/**/*.rs'):
    if 'target' in f.parts: continue
    text=f.read_text()
    cut=re.search(r'#\[cfg\(test\)\]\s*mod\s+\w+', text)
    if cut: text=text[:cut.start()]
    lines=text.split('\n')
    i=0
    while i<len(lines):
        l=lines[i]
        m=re.match(r'\s*(pub(\([^)]*\))?\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)',l)
        if m:
            depth=0; started=False; j=i
            while j<len(lines):
                for ch in lines[j]:
                    if ch=='{': depth+=1; started=True
                    elif ch=='}': depth-=1
                if started and depth<=0: break
                if not started and lines[j].rstrip().endswith(';'): break
                j+=1
            if started: res.append((j-i+1,str(f),i+1,m.group(5)))
            i=j+1 if started else i+1
        else: i+=1
res.sort(reverse=True)
for r in res[:int(sys.argv[1]) if len(sys.argv)>1 else 25]:
    if r[0]>60: print(*r)
